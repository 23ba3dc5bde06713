"""The command line: training runs and the loss falls; any Recipe field can be set (a nested one by its dotted
name); bad input is one line and exit code 2, no traceback; --help loads no torch."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gptcore.cli import main
from gptcore.config import Recipe
from gptcore.presets import MODELS, RECIPES, RENAMED_RECIPES
from gptcore.training.trainer import Trainer
from tests.helpers import run_cli

pytestmark = pytest.mark.cpu


def shell(*args: str) -> subprocess.CompletedProcess:
    """``python -m gptcore ARGS`` in a child process, as from the shell."""
    return subprocess.run([sys.executable, "-m", "gptcore", *args], capture_output=True, text=True, timeout=300)


def test_train_runs_and_the_loss_falls():
    # in this process: a child would spend ~6 s importing torch and dynamo first
    out = run_cli("train", "--model", "cpu-small", "--recipe", "fp32", "--steps", "50", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    first, last = map(float, re.search(r"loss ([\d.]+) at step 1 -> ([\d.]+) at step 50", out.stdout).groups())
    # the loss of step 1, before any learning: ln 77 = 4.344 within 0.1 nats (the logits at init add about var/2 =
    # 0.03 nats to a uniform prediction's, and one batch's own spread the rest; measured 4.36)
    assert abs(first - math.log(77)) < 0.1
    assert last < first - 0.5  # measured 4.36 -> 3.2 (the lr is still warming up)
    assert "tok/s" in out.stdout and "ms/step" in out.stdout
    assert "peak process RSS" in out.stdout  # says what the figure is
    assert "compile" not in out.stdout  # nothing compiled, so nothing to include


def _clock(monkeypatch, *readings: float) -> None:
    """``train``'s clock reads ``readings`` in turn, then the last one for good."""
    from gptcore.cli import train as command

    ticks = iter(readings)
    monkeypatch.setattr(command, "time", SimpleNamespace(perf_counter=lambda: next(ticks, readings[-1])))


def test_train_times_its_steps_at_the_batch_asked_and_says_when_compile_is_included(monkeypatch, capsys):
    """The summary's figures from a clock read at the start and the end (10 s and 12 s: 2 s for 4 steps), at the
    batch --batch asks for (4 sequences of 64 tokens), which a recipe's fit_memory does not override; a compiled
    recipe's time says that compile is in it. The steps are stood in for: the line is what is tested."""

    def run(self, steps: int, log_every: int = 0, on_log=None) -> list[float]:
        for step, loss in ((1, 4.0), (steps, 3.0)):
            on_log(step, loss)
        return [4.0, 3.0]

    monkeypatch.setattr(Trainer, "run", run)
    args = ["train", "--model", "cpu-small", "--steps", "4", "--batch", "4", "--device", "cpu"]
    _clock(monkeypatch, 10.0, 12.0)
    assert main([*args, "--set", "fit_memory=0.5"]) == 0
    out = capsys.readouterr()
    assert "4 steps in 2.0 s (500.0 ms/step, 512 tok/s)" in out.out and "compile" not in out.out
    assert "fit_memory" not in out.err  # --batch chose the batch
    _clock(monkeypatch, 10.0, 12.0)
    assert main([*args, "--set", "compile=true"]) == 0
    assert "(500.0 ms/step, 512 tok/s, compile included)" in capsys.readouterr().out


def test_train_with_evaluations_times_the_training_alone(monkeypatch, capsys):
    """With --eval-every the time is the training's (the run's own seconds, 3 s), not the clock's 90 s, which the
    evaluations are part of."""
    from gptcore.measure import convergence

    def trained(trainer, schedule, on_eval=None):
        run = convergence.Convergence([0, 2, 4], [4.3, 3.9, 3.5], [None, 4.0, 3.6], [0.0, 1.0, 3.0], 256, None)
        for point in zip(run.steps, run.val_loss, run.train_loss):
            on_eval(*point)
        return run

    monkeypatch.setattr(convergence, "train_and_evaluate", trained)
    _clock(monkeypatch, 10.0, 100.0)
    args = ["train", "--model", "cpu-small", "--steps", "4", "--batch", "4", "--device", "cpu", "--eval-every", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "4 steps in 3.0 s (750.0 ms/step, 341 tok/s)" in out and "over the first 2 steps" in out
    args[args.index("--eval-every") + 1] = "5"  # an evaluation period past the last step: 4 steps ran, not 5
    _clock(monkeypatch, 10.0, 100.0)
    assert main(args) == 0
    assert "train loss 4.0000 over the first 4 steps -> 3.6000 over the last" in capsys.readouterr().out


def test_set_changes_recipe_fields_and_says_so(monkeypatch, capsys):
    ran = []
    init = Trainer.__init__

    def recorded(self, cfg, recipe, device, *args, **kwargs):  # the recipe the run trains, not the one it names
        ran.append(recipe)
        init(self, cfg, recipe, device, *args, **kwargs)

    monkeypatch.setattr(Trainer, "__init__", recorded)
    args = ["train", "--model", "cpu-small", "--steps", "2", "--device", "cpu"]
    args += ["--set", "checkpoint=true", "--set", "grad_accum_steps=4", "--set", "grad_clip=none"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "--set checkpoint=true --set grad_accum_steps=4 --set grad_clip=none" in out
    [recipe] = ran
    assert (recipe.checkpoint, recipe.grad_accum_steps, recipe.grad_clip) == (True, 4, None)
    assert recipe == dataclasses.replace(RECIPES["fp32"], checkpoint=True, grad_accum_steps=4, grad_clip=None)


def test_set_values_are_converted_by_the_field_type():
    from gptcore.cli import apply_assignments

    recipe = apply_assignments(
        RECIPES["fp32"], ["checkpoint=yes", "grad_accum_steps=4", "lr=3e-4", "grad_clip=None", "precision=bf16"]
    )
    assert (recipe.checkpoint, recipe.grad_accum_steps, recipe.lr, recipe.grad_clip, recipe.precision) == (
        True,
        4,
        3e-4,
        None,
        "bf16",
    )


def test_set_reaches_a_nested_field_by_its_dotted_name():
    from gptcore.cli import apply_assignments

    assert (
        apply_assignments(RECIPES["fsdp2"], ["parallel.fsdp2.reshard_after_forward=false"])
        == RECIPES["fsdp2-no-reshard"]
    )
    # a None-able nested config is switched on (with its defaults) and off by true/false
    assert (
        apply_assignments(RECIPES["fp32"], ["parallel.ddp=true", "parallel.ddp.gradient_as_bucket_view=yes"])
        == RECIPES["ddp-bucket-view"]
    )
    assert apply_assignments(RECIPES["ddp"], ["parallel.ddp=off"]) == RECIPES["fp32"]


def test_set_goes_on_from_a_group_switched_off_and_names_a_nested_field_whole():
    """A field of a group switched off earlier switches it back on with its defaults; spaces around FIELD and VALUE
    are the shell's, not the field's; a value a nested field cannot take is refused naming the field by its dotted
    name, as the user wrote it."""
    from gptcore.cli import apply_assignments
    from gptcore.config import DDPOptions
    from gptcore.overrides import OverrideError

    on_again = apply_assignments(RECIPES["fp32"], ["parallel.ddp=false", "parallel.ddp.bucket_cap_mb=10"])
    assert on_again.parallel.ddp == DDPOptions(bucket_cap_mb=10.0)
    assert apply_assignments(RECIPES["fp32"], [" checkpoint = true "]).checkpoint is True
    with pytest.raises(OverrideError, match=r"^--set parallel\.ddp\.bucket_cap_mb=x: expected float$"):
        apply_assignments(RECIPES["fp32"], ["parallel.ddp.bucket_cap_mb=x"])


def test_an_old_recipe_name_runs_with_one_deprecation_line():
    old, new = "fused-optim", RENAMED_RECIPES["fused-optim"]
    out = shell("train", "--model", "cpu-small", "--recipe", old, "--steps", "2", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    warning = [line for line in out.stderr.splitlines() if "warning" in line]
    assert warning == [
        f"gptcore: warning: recipe {old!r} is now called {new!r}; the old name will be removed in the next release"
    ]


@pytest.mark.parametrize(
    "args,expected",
    [
        (["train", "--model", "nope"], "choose from char, char-ctx2"),
        (["train", "--model", "cpu-smal"], "did you mean 'cpu-small'?"),
        (["train", "--model", "cpu-small", "--recipe", "nope"], "choose from fp32"),
        (["train", "--model", "cpu-small", "--recipe", "bf61"], "did you mean 'bf16'?"),
        (["train", "--model", "cpu-small", "--recipe", "tf32", "--device", "cpu"], "tf32 is a CUDA"),
        (
            ["train", "--model", "cpu-small", "--recipe", "ladder-5", "--set", "attention=flash"],
            "flash attention needs",
        ),
        (
            ["train", "--model", "cpu-small", "--recipe", "ladder-9-liger", "--device", "cpu"],
            "liger's fused linear cross",
        ),
        (["train", "--model", "char", "--recipe", "budget-0.05", "--device", "cpu"], "pytorch/pytorch#190758"),
        (["train", "--model", "cpu-small", "--steps", "0"], "argument --steps: must be >= 1"),
        (["train", "--model", "cpu-small", "--batch", "0"], "argument --batch: must be >= 1"),
        (["train", "--model", "cpu-small", "--log-every", "0"], "argument --log-every: must be >= 1"),
        (["train", "--model", "cpu-small", "--batch", "7", "--recipe", "grad-accum"], "grad_accum_steps"),
        (["train", "--model", "cpu-small", "--set", "checkpoint"], "expected FIELD=VALUE"),
        (["train", "--model", "cpu-small", "--set", "grad_acum_steps=4"], "did you mean 'grad_accum_steps'?"),
        (["train", "--model", "cpu-small", "--set", "grad_accum_steps=four"], "expected int"),
        (["train", "--model", "cpu-small", "--set", "optim_in_backward=true"], "grad_clip: global-norm clipping"),
        (["train", "--model", "cpu-small", "--set", "precision=fp8"], "precision: unknown 'fp8'"),
        (
            ["train", "--model", "cpu-small", "--set", "parallel.reshard_after_forward=false"],
            "did you mean 'parallel.fsdp2.reshard_after_forward'?",
        ),
        (["train", "--model", "cpu-small", "--set", "parallel=ddp"], "parallel is a group of fields; set parallel.ddp"),
        (
            ["train", "--model", "cpu-small", "--recipe", "ddp", "--set", "parallel.ddp.bucket_cap_mb=0"],
            "parallel.ddp.bucket_cap_mb: must be a finite number > 0",
        ),
        (["train", "--model", "cpu-small", "--set", "grad_clip=-1"], "grad_clip: must be a number > 0, or None"),
        (["train", "--model", "cpu-small", "--set", "beta1=2"], "beta1: must be in [0, 1), got 2.0"),
        (["train", "--model", "cpu-small", "--set", "seed=-1"], "seed: must be in [0, inf), got -1"),
        (["estimate", "--model", "gpt2-xxl"], "unknown 'gpt2-xxl'"),
        (["estimate", "--model", "gpt2", "--seq", "0"], "argument --seq: must be >= 1"),
        (["estimate", "--model", "gpt2", "--fit", "0"], "argument --fit: must be in (0, 1], got 0.0"),
        (["compare", "HEAD", "-k", "x", "--threshold", "1"], "argument --threshold: must be in [0, 1), got 1.0"),
        (["compare", "HEAD", "-k", "x", "--threshold", "-0.1"], "argument --threshold: must be in [0, 1), got -0.1"),
        (["train"], "required"),
        (["fly"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, expected, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gptcore: error:") and expected in err, err


def test_out_of_memory_on_the_cpu_is_one_line_and_exit_code_1(monkeypatch, capsys):
    # the CPU allocator's failure is a RuntimeError, not torch.OutOfMemoryError. Building: a vocabulary padded to
    # 2**40 rows, 2**47 floats and more, beyond any address space; in a step: a real allocation of 2**62 bytes
    assert main(["train", "--model", "cpu-small", "--steps", "1", "--set", f"vocab_multiple={2**40}"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "gptcore: error: out of memory on cpu building the model and its optimizer"
    assert "Traceback" not in err
    monkeypatch.setattr(Trainer, "step", lambda self, batch=None: torch.empty(2**62, dtype=torch.uint8))
    assert main(["train", "--model", "cpu-small", "--steps", "1"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("gptcore: error: out of memory on cpu after step 0 (peak"), err
    assert "Traceback" not in err


def test_sigterm_while_training_is_one_line_and_exit_code_130():
    """A CI job's time-out sends SIGTERM: the command stops as on Ctrl-C, with one line and no traceback (a child
    process, whose first step sends SIGTERM to itself)."""
    child = """
import os, signal, sys
from gptcore.cli import main
from gptcore.training.trainer import Trainer
Trainer.step = lambda self, batch=None: os.kill(os.getpid(), signal.SIGTERM)
sys.exit(main(["train", "--model", "cpu-small", "--steps", "5"]))
"""
    checkout = Path(__file__).resolve().parents[1]  # the child imports this checkout's gptcore
    done = subprocess.run([sys.executable, "-c", child], cwd=checkout, capture_output=True, text=True, timeout=120)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == "gptcore: interrupted"


def test_a_folder_an_output_would_be_made_in_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    """--plot's folder does not exist yet, and the folder it would be made in is not writable (faked: root, as CI
    runs, may write anywhere): one line naming that folder, before any work."""
    import os

    run = str(Path(__file__).parent / "data" / "cpu-report-run.json")
    monkeypatch.setattr(os, "access", lambda path, mode, **kwargs: Path(path) != tmp_path)
    assert main(["report", run, "--plot", str(tmp_path / "plots" / "a")]) == 2
    assert (
        capsys.readouterr().err
        == f"gptcore: error: --plot {tmp_path / 'plots' / 'a'}: cannot create it under {tmp_path}\n"
    )


def test_an_output_that_cannot_be_written_is_one_line_before_any_work(tmp_path, capsys):
    # a comparison or a merge can take an hour: where it writes is checked first, not after
    run = str(Path(__file__).parent / "data" / "cpu-report-run.json")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for args, expected in (
        (["report", run, "--html", str(tmp_path)], f"--html {tmp_path}: is a folder; give a file"),
        (["report", run, "--plot", str(a_file)], f"--plot {a_file}: not a folder"),
        (
            ["compare", "HEAD", "-k", "x", "--json", "/proc/nope/x.json"],
            "--json /proc/nope/x.json: cannot create its folder",
        ),
        (["history", "--storage", str(tmp_path), "--markdown", str(tmp_path)], "--markdown"),
        # a folder where no file can be made: os.access says yes to root there, so it was found only at the end
        (["report", run, "--html", "/proc/report.html"], "--html /proc/report.html: not writable"),
    ):
        assert main(args) == 2, args
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and err.startswith("gptcore: error:") and expected in err, err
        assert out == "", out  # nothing was done before the line


def test_bad_input_from_the_shell_has_no_traceback():
    out = shell("train", "--model", "nope")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1


def test_help_and_list_import_no_torch():
    code = (
        "import sys, contextlib, io\n"
        "from gptcore.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['list'])\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_list_names_every_model_and_recipe(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = {line.split()[0] for line in lines if line.strip()}
    assert set(MODELS) <= names and set(RECIPES) <= names
    assert not set(RENAMED_RECIPES) & names  # old names run, but are no longer listed


def test_estimate_prints_the_breakdown_in_a_unit_that_fits(capsys):
    assert main(["estimate", "--model", "cpu-small", "--recipe", "checkpoint", "--device", "cpu", "--simulate"]) == 0
    out = capsys.readouterr().out
    for text in ("analytic", "simulated", "activations", "phase of the peak", "16.0 bytes/parameter", "MiB"):
        assert text in out, text
    assert "0.00 GiB" not in out
    assert main(["estimate", "--model", "gpt2-xl", "--batch", "32", "--recipe", "bf16"]) == 0
    assert "GiB" in capsys.readouterr().out


def test_estimate_takes_set_like_train(capsys):
    assert main(["estimate", "--model", "cpu-small", "--device", "cpu", "--set", "checkpoint=true"]) == 0
    with_set = capsys.readouterr().out.split("\n", 1)[1]
    assert main(["estimate", "--model", "cpu-small", "--device", "cpu", "--recipe", "checkpoint"]) == 0
    assert capsys.readouterr().out.split("\n", 1)[1] == with_set  # same numbers; only the title differs
    assert main(["estimate", "--model", "cpu-small", "--device", "cpu", "--checkpoint"]) == 0
    flag = capsys.readouterr().out.split("\n", 1)
    assert flag[1] == with_set and flag[0].startswith("cpu-small / fp32 + checkpoint on cpu")  # --checkpoint: the same


def test_estimate_fits_the_batch_at_the_sequence_length_asked_and_refuses_a_batch_beside_a_fit():
    """--fit chooses the batch for the --seq given (a longer sequence fits fewer), so --batch with it is refused."""
    from gptcore.memory.fit import fit_batch

    cfg, capacity = MODELS["cpu-small"], 100_000_000
    fits = {
        seq: fit_batch(dataclasses.replace(cfg, block_size=seq), Recipe(), "cpu", capacity, 0.5).batch
        for seq in (64, 256)
    }
    assert fits[64] > fits[256]
    for seq, batch in fits.items():
        args = ["--device", "cpu", "--capacity", str(capacity), "--fit", "0.5", "--seq", str(seq)]
        out = run_cli("estimate", "--model", "cpu-small", *args).stdout
        assert f"batch {batch}, seq {seq}" in out and f"fit: batch {batch} is the largest" in out
    done = run_cli("estimate", "--model", "cpu-small", "--device", "cpu", "--fit", "0.5", "--batch", "8")
    [line] = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "--batch and --fit (or a recipe's fit_memory) both choose the batch" in line
    alone = run_cli("estimate", "--model", "cpu-small", "--device", "cpu", "--capacity", "1000")  # ignored before
    [line] = alone.stderr.strip().splitlines()
    assert (
        alone.returncode == 2
        and line == "gptcore: error: --capacity is the memory --fit fills: give --fit SHARE with it"
    )


def test_an_interpreter_given_relative_to_the_cwd_is_made_absolute_but_not_resolved(tmp_path, monkeypatch):
    # compare runs each side in a temporary worktree: a relative path would point nowhere there; a venv's python
    # is a link, and following it would lose the venv
    from gptcore.cli import _parser

    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    args = _parser().parse_args(["compare", "-k", "x", "--python-a", "venv/bin/python"])
    assert args.python_a == str(venv / "python")  # one that does not exist: test_compare's one-line error
