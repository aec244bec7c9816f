"""The Flower apps osfl deploys (``osfl.flower_app.apps``): what their log
stream shows a Flower user. The apps' message flow and records are checked
against the simulation in ``tests/flower/test_flower.py``."""

from __future__ import annotations


def test_the_serverapp_stream_does_not_echo_the_run_stopped_line() -> None:
    """A refused site's reason reaches a Flower user once from the ServerApp
    (Flower's own one-line log of its exception), not also as the run
    directory's "run stopped" line; that line stays in run.log."""
    import logging

    from osfl.flower_app import apps

    logger = logging.getLogger("osfl")
    kept, level = list(logger.handlers), logger.level
    for h in kept:
        logger.removeHandler(h)
    try:
        apps._log_to_flower()
        (handler,) = logger.handlers

        def record(name: str, msg: str) -> logging.LogRecord:
            return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, (), None)

        assert not handler.filter(record("osfl.rundir", "run stopped: %s: %s (finished ...)"))
        assert handler.filter(record("osfl.flower_app.apps", "osfl Flower run: fedavg seed 0"))
    finally:
        for h in list(logger.handlers):
            logger.removeHandler(h)
        for h in kept:
            logger.addHandler(h)
        logger.setLevel(level)
