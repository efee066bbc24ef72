"""Fixtures for the config tests."""

from __future__ import annotations

import pytest
import typer

from kubegpu.config.cli import register


def make_app() -> typer.Typer:
    """A typer app holding only this component's commands, so other components' state cannot affect the tests."""
    app = typer.Typer(pretty_exceptions_enable=False)

    @app.callback()
    def _root() -> None:
        """kubegpu (test root)."""

    register(app)
    return app


@pytest.fixture
def cli_app() -> typer.Typer:
    return make_app()
