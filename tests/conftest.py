"""Fixtures shared across suites, in the Flask tutorial's style: ``app`` and ``client``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.server import create_app
from app.settings import Settings
from app.source.static import StaticSource
from tests.support import ROOT

EXAMPLES = ROOT / "manifests" / "examples"


@pytest.fixture
def settings() -> Settings:
    return Settings(rbac_dir=EXAMPLES)


@pytest.fixture
def source(settings: Settings) -> Iterator[StaticSource]:
    src = StaticSource(EXAMPLES, settings.compiler)
    src.start()
    yield src
    src.stop()


@pytest.fixture
def app(settings: Settings, source: StaticSource) -> Flask:
    application = create_app(settings, source)
    application.config["TESTING"] = True
    return application


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()
