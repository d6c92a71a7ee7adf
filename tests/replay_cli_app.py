"""``ratchet replay --app tests.replay_cli_app:app``: the replay tests' workflows (both
versions) on the model stub and finance simulator whose URLs the test passes in the
environment (the replay must call neither)."""

from __future__ import annotations

import os

from ratchet.actors.agents.openai_model import OpenAICompatibleModel
from tests.replay_apps import claim_workflow, registry

_model = OpenAICompatibleModel(os.environ.get("RATCHET_TEST_STUB_URL", "http://127.0.0.1:9"),
                               "gpt-test", timeout=5)
app = registry(_model, os.environ.get("RATCHET_FINANCE_URL", "http://127.0.0.1:9"),
               claim_workflow(_model), claim_workflow(
                   _model, 2, factor=2.0, route="done", prompt="What is the meals limit?"))
