"""The session plan: each stage's cases planned before a GPU is at hand, cut into calls that fit the deadline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gptcore import plan
from gptcore.presets import MODELS, RECIPES
from gptcore.stages import ORDER, STAGES

from .test_gate import ROOT, child_env

pytestmark = pytest.mark.cpu


def test_the_analytic_flops_are_the_models_own_count():
    from gptcore.model import GPT

    for model, recipe in (("cpu-small", "ckpt-fp32"), ("gpt2", "ladder-8"), ("char", "fp32")):
        cfg, r = MODELS[model], RECIPES[recipe]
        counted = GPT(cfg, r).flops_per_token() if not r.checkpoint else None
        if counted is not None:  # the model counts no recomputation: compare without checkpointing
            assert plan.flops_per_token(cfg, r) == counted
    cfg = MODELS["cpu-small"]
    plain, ckpt = plan.flops_per_token(cfg, RECIPES["fp32"]), plan.flops_per_token(cfg, RECIPES["checkpoint"])
    head = 6 * RECIPES["fp32"].vocab_rows(cfg) * cfg.n_embd
    assert ckpt - head == pytest.approx((plain - head) * 4 / 3)  # the blocks' forward again


def test_calls_cut_a_stage_at_its_deadline_and_keep_an_oversized_case_alone():
    from scripts.gpu_stage import calls

    assert calls([100, 200, 300, 50], 540) == [[0, 1], [2, 3]]
    assert calls([600, 10], 540) == [[0], [1]]
    assert calls([], 540) == []


@pytest.mark.slow  # collects every GPU stage: ~5 s
def test_the_plan_prints_every_stage_and_every_call_fits():
    env = child_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the script's `python` is this one
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "plan"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ORDER:
        assert f"== {name}: " in done.stdout
    for node in STAGES["smoke"].pytest:
        assert node in done.stdout  # every smoke case is a collected test
    assert "Every call fits its deadline by this estimate" in done.stdout
