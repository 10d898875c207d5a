"""The fixtures of real servers on loopback (``cutline.examples.servers``),
one a test, each on a port and in a folder of its own, so that tests run side by side under
pytest-xdist. A fixture skips its test only when its server cannot run here (its package is
not installed, or it does not come up: :class:`ServerUnavailable`, whose message says why)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

import pytest

from cutline.examples.servers import KafkaBroker, PostgresServer, ServerUnavailable

Server = TypeVar("Server", KafkaBroker, PostgresServer)


def serving(kind: type[Server], **options: Any) -> Iterator[Server]:
    """A started server of ``kind`` while the test runs, closed after it; skip the test if
    the server cannot run here."""
    try:
        server = kind(**options)
    except ServerUnavailable as error:
        pytest.skip(f"{kind.__name__} cannot run here: {error}")
    try:
        server.start()
    except ServerUnavailable as error:
        server.close()
        pytest.skip(f"{kind.__name__} cannot run here: {error}")
    with server:
        yield server


@pytest.fixture
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A running Tansu broker, in memory and empty; its log in a folder of pytest's. Produce
    with ``produce(broker, topic, records, partition=...)``: one record a batch, as Tansu
    needs."""
    yield from serving(KafkaBroker, directory=tmp_path_factory.mktemp("kafka"))


@pytest.fixture
def postgres(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PostgresServer]:
    """A running PostgreSQL on a cluster of its own (``max_prepared_transactions=64``). Other
    options by indirect parametrization::

        @pytest.mark.parametrize("postgres", [{"max_prepared_transactions": 0}], indirect=True)
    """
    options = getattr(request, "param", {})
    yield from serving(PostgresServer, directory=tmp_path_factory.mktemp("postgres"), **options)
