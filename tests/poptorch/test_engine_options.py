"""`POPLAR_ENGINE_OPTIONS`, Poplar's environment variable for its engine (PopVision's `autoReport.*`, set by
hand or by Lightning's `IPUStrategy(autoreport=True)`): no Poplar engine runs here, so compiling says once
that it has no effect, instead of silently writing no report."""

import json
import logging

import pytest
import torch
from torch import nn

import poptorch
from optimum_ipu import _once


@pytest.fixture(autouse=True)
def _say_no_effect_again():
    _once.forget()
    yield


def said(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("POPLAR_ENGINE_OPTIONS")]


def test_autoreport_in_poplar_engine_options_says_once_no_report_is_written(monkeypatch, caplog, tmp_path):
    reports = tmp_path / "reports"
    engine_options = {"autoReport.all": "true", "autoReport.directory": str(reports)}
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps(engine_options))
    with caplog.at_level(logging.WARNING, logger="poptorch"):
        for _ in range(2):
            model = poptorch.inferenceModel(nn.Linear(2, 2))
            model(torch.ones(1, 2))
    assert len(said(caplog)) == 1
    assert "no effect on the simulated IPU" in said(caplog)[0] and "compile report" in said(caplog)[0]
    assert not reports.exists()


def test_without_poplar_engine_options_nothing_is_said(monkeypatch, caplog):
    monkeypatch.delenv("POPLAR_ENGINE_OPTIONS", raising=False)
    with caplog.at_level(logging.WARNING, logger="poptorch"):
        poptorch.inferenceModel(nn.Linear(2, 2))(torch.ones(1, 2))
    assert said(caplog) == []
