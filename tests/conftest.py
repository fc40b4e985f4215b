"""Fixtures shared across suites, in the Flask tutorial's style: ``app`` and ``client``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from app.settings import Settings
from app.source.static import StaticSource
from app.webhook.server import create_app
from tests.support import ROOT

EXAMPLES = ROOT / "manifests" / "examples"

# Property-based tests: a small, repeatable run by default (CI); LABEL_RBAC_HYPOTHESIS=thorough
# explores far more, with fresh random examples each run.
hypothesis_settings.register_profile(
    "ci",
    max_examples=25,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
hypothesis_settings.register_profile(
    "thorough",
    max_examples=2000,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
hypothesis_settings.load_profile(os.environ.get("LABEL_RBAC_HYPOTHESIS", "ci"))


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
