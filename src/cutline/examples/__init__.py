"""Example jobs: small, complete programs that show one capability each."""
