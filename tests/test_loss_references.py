"""Per-CPU-model loss references: a baseline entry holds the loss of each CPU model that recorded one, and a run on
such a model is held to its own reference with the same-CPU tolerances (fp32 1e-6, bf16 5e-4 nats)."""

from __future__ import annotations

import json
import subprocess

import pytest

from gptcore import identity
from gptcore.gate import baselines, schema, verdicts
from gptcore.gate.checks import FAIL, OK
from gptcore.gate.schema import Entry, Tolerances
from tests.test_gate import new_gate

pytestmark = pytest.mark.cpu
XEON, EPYC, OTHER = "Intel(R) Xeon(R) Processor", "AMD EPYC", "Some ARM core"
TOL = Tolerances.default_for("cpu")


def entry(loss: float, cpu: str, precision: str = "fp32", **kw) -> Entry:
    return Entry(
        tokens_per_s=1000.0,
        tokens_per_s_iqr=10.0,
        peak_allocated_bytes=1_000_000,
        peak_reserved_bytes=None,
        loss=loss,
        loss_step=47,
        precision=precision,
        cpu_model=cpu,
        **kw,
    )


def loss_check(measured: Entry, baseline: Entry):
    verdict = verdicts.verdict_of("case", measured, baseline, TOL)
    return next(c for c in verdict.checks if c.metric == "loss")


# the two models' real drift is up to 7.2e-7 (fp32) here; 3e-6 is a change in the model's math (GELU -> tanh)
RECORDED = entry(3.0791, XEON, loss_by_cpu={EPYC: 3.0791007})


@pytest.mark.parametrize("cpu, reference", [(XEON, 3.0791), (EPYC, 3.0791007)])
def test_a_3e6_change_fails_on_every_cpu_model_with_a_reference(cpu: str, reference: float):
    assert loss_check(entry(reference, cpu), RECORDED).status == OK
    check = loss_check(entry(reference + 3e-6, cpu), RECORDED)
    assert check.status == FAIL and f"reference of {cpu}" in check.note


def test_a_model_without_a_reference_gets_the_wide_tolerance_and_says_whose_loss():
    check = loss_check(entry(3.0791 + 3e-6, OTHER), RECORDED)
    assert check.status == OK and f"held to {XEON}'s" in check.note and "±0.0001" in check.note
    assert loss_check(entry(3.0791 + 2e-4, OTHER), RECORDED).status == FAIL


def test_bf16_uses_the_same_cpu_amp_tolerance_against_its_reference():
    recorded = entry(3.10, XEON, "bf16", loss_by_cpu={EPYC: 3.1004})
    assert loss_check(entry(3.1004 + 4e-4, EPYC, "bf16"), recorded).status == OK
    assert loss_check(entry(3.1004 + 6e-4, EPYC, "bf16"), recorded).status == FAIL  # > 5e-4, < 2e-2


def test_adding_a_reference_changes_nothing_else(tmp_path):
    path = tmp_path / "cpu.json"
    baselines.update(
        path, "cpu", {"a": entry(3.0791, XEON), "b": entry(2.5, XEON)}, device_name=XEON, device_type="cpu"
    )
    before = json.loads(path.read_text())
    added, skipped = baselines.add_loss_references(path, "cpu", {"a": entry(3.0791007, EPYC), "c": entry(1.0, EPYC)})
    assert (added, skipped) == (1, ["c"])
    after = json.loads(path.read_text())
    assert after["benchmarks"]["a"]["loss"].pop("by_cpu") == {EPYC: 3.0791007}
    assert after == before
    assert baselines.load(path, "cpu").entries["a"].loss_reference(EPYC) == (3.0791007, EPYC)


def test_re_recording_keeps_other_references_only_when_this_cpu_reads_the_same_loss(tmp_path):
    path = tmp_path / "cpu.json"
    baselines.update(path, "cpu", {"a": entry(3.0791, XEON)}, device_name=XEON, device_type="cpu")
    baselines.add_loss_references(path, "cpu", {"a": entry(3.0791007, EPYC)})
    baselines.add_loss_references(path, "cpu", {"a": entry(3.0791011, OTHER)})
    # re-recorded on EPYC with its own loss unchanged (memory moved): XEON's loss, and OTHER's reference, stay
    baselines.update(path, "cpu", {"a": entry(3.0791007, EPYC)}, device_name=EPYC, device_type="cpu")
    kept = baselines.load(path, "cpu").entries["a"]
    assert (kept.cpu_model, kept.loss, kept.loss_by_cpu) == (EPYC, 3.0791007, {XEON: 3.0791, OTHER: 3.0791011})
    # the loss moved on EPYC: the arithmetic changed, so no other model's reference can be trusted
    baselines.update(path, "cpu", {"a": entry(3.05, EPYC)}, device_name=EPYC, device_type="cpu")
    assert baselines.load(path, "cpu").entries["a"].loss_by_cpu == {}


def test_a_malformed_reference_is_a_clear_error(tmp_path):
    path = tmp_path / "cpu.json"
    baselines.update(path, "cpu", {"a": entry(3.0, XEON)}, device_name=XEON, device_type="cpu")
    data = json.loads(path.read_text())
    data["benchmarks"]["a"]["loss"]["by_cpu"] = {EPYC: "3.0"}
    path.write_text(json.dumps(data))
    with pytest.raises(schema.BaselineError, match=r"loss\.by_cpu: expected an object"):
        baselines.load(path, "cpu")


ZEN3 = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n\n"
    "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
)
ZEN4 = ZEN3.replace("model\t\t: 1", "model\t\t: 17")


def test_two_cpu_generations_with_one_model_name_are_two_cpu_models():
    """'AMD EPYC' names Zen 3 (bf16 emulated) and Zen 4 (AVX-512 BF16): their loss references must not mix."""
    assert identity.cpu_model(ZEN3) == "AMD EPYC (family 25, model 1)"
    assert identity.cpu_model(ZEN4) == "AMD EPYC (family 25, model 17)"
    assert identity.cpu_model("model name\t: Some ARM core\n") == "Some ARM core"


NEOVERSE_V1 = (  # /proc/cpuinfo as aarch64 Linux lays it out, of a Neoverse V1 (Graviton3): no model name
    "processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve "
    "svebf16 i8mm bf16\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd40\n"
    "CPU revision\t: 1\n\nprocessor\t: 1\nCPU implementer\t: 0x41\nCPU part\t: 0xd40\n"
)
NEOVERSE_N1 = NEOVERSE_V1.replace("0xd40", "0xd0c").replace(" sve svebf16 i8mm bf16", "").replace("0x1", "0x3")


def test_two_arm_cores_are_two_cpu_models_though_the_kernel_names_neither(monkeypatch):
    """Graviton2 (Neoverse N1, no bf16) and Graviton3 (V1, bf16): /proc/cpuinfo gives no model name on either, and
    without their part numbers both would be 'aarch64', and one's loss references would be held against the other's."""
    monkeypatch.setattr(identity.platform, "machine", lambda: "aarch64")
    v1, n1 = identity.cpu_model(NEOVERSE_V1), identity.cpu_model(NEOVERSE_N1)
    assert v1 == "aarch64 (implementer 0x41, part 0xd40)" and n1 == "aarch64 (implementer 0x41, part 0xd0c)"
    generic = "model name\t: ARMv8 Processor rev 1 (v8l)\n" + NEOVERSE_V1.split("\n\n")[0]  # some kernels name it so
    assert identity.cpu_model(generic) == "ARMv8 Processor rev 1 (v8l) (implementer 0x41, part 0xd40)"


def test_a_macs_cpu_model_is_its_chip_not_arm(monkeypatch):
    # macOS has no /proc/cpuinfo and platform.processor() says 'arm' of an M1 (no bf16) and an M2 (bf16) alike
    calls = []

    def sysctl(args, **kwargs):
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, stdout="Apple M2 Pro\n", stderr="")

    monkeypatch.setattr(identity.subprocess, "run", sysctl)
    monkeypatch.setattr(identity.platform, "processor", lambda: "arm")
    monkeypatch.setattr(identity.sys, "platform", "darwin")
    assert identity.cpu_model("") == "Apple M2 Pro"
    assert calls == [["sysctl", "-n", "machdep.cpu.brand_string"]]
    monkeypatch.setattr(identity.sys, "platform", "linux")
    assert identity.cpu_model("") == "arm" and len(calls) == 1  # Linux asks no sysctl


def test_update_loss_references_says_under_the_table_what_it_added_and_what_it_skipped(tmp_path):
    """--update-loss-references on EPYC over a file XEON recorded: 'a' gains EPYC's reference; 'c' has no entry and
    is skipped, and the line under the end table counts both."""
    from types import SimpleNamespace

    path = tmp_path / "cpu.json"
    baselines.update(path, "cpu", {"a": entry(3.0791, XEON)}, device_name=XEON, device_type="cpu")
    gate = new_gate(tmp_path, update_loss=True, cpu_model=EPYC)
    for name, loss in (("a", 3.0791007), ("c", 1.0)):
        gate.judge_entry(SimpleNamespace(name=name, nodeid=f"bench/x.py::{name}"), entry(loss, EPYC), "cpu")
    gate.write_updates()
    assert [row.verdict for row in gate.rows] == [f"loss reference of {EPYC} recorded"] * 2
    assert gate.summary_notes() == [
        f"baselines: added 1 loss reference(s) of {EPYC} to {path}; skipped 1 (no entry, or a loss read at another "
        "step)"
    ]
    assert baselines.load(path, "cpu").entries["a"].loss_by_cpu == {EPYC: 3.0791007}


def judged_notes(tmp_path, measured: dict[str, Entry], recorded: dict[str, Entry], epyc: dict[str, Entry]) -> list[str]:
    """The lines under the end table after the gate judged ``measured`` against a file that XEON recorded and EPYC
    added loss references to (``epyc``)."""
    from types import SimpleNamespace

    baselines.update(tmp_path / "cpu.json", "cpu", recorded, device_name=XEON, device_type="cpu")
    baselines.add_loss_references(tmp_path / "cpu.json", "cpu", epyc)
    gate = new_gate(tmp_path, cpu_model=EPYC)
    for name, e in measured.items():
        gate.judge_entry(SimpleNamespace(name=name, nodeid=f"bench/x.py::{name}"), e, "cpu")
    return gate.summary_notes()


def test_the_table_says_whose_loss_reference_each_case_was_held_to(tmp_path):
    """Two cases held to EPYC's own reference, one to XEON's (EPYC has none there): counted per reference, the
    other CPU model's named as such (its tolerance is the wider one)."""
    recorded = {"a": entry(3.0791, XEON), "b": entry(3.0791, XEON), "c": entry(2.5, XEON)}
    measured = {"a": entry(3.0791007, EPYC), "b": entry(3.0791007, EPYC), "c": entry(2.5, EPYC)}
    assert judged_notes(tmp_path, measured, recorded, {k: measured[k] for k in "ab"}) == [
        f"loss held to the reference of {EPYC} (2 cases)",
        f"loss held to the reference of {XEON}, another CPU model: the wider tolerance (1 case)",
    ]


def test_a_half_precision_case_recorded_on_another_cpu_model_says_its_peak_leaves_out_the_kernels_scratch(tmp_path):
    from gptcore.gate import checks

    recorded = {"a": entry(3.10, XEON, "bf16"), "b": entry(3.0791, XEON)}
    measured = {"a": entry(3.1004, EPYC, "bf16"), "b": entry(3.0791, EPYC)}
    assert checks.kernel_note(XEON, 1) in judged_notes(tmp_path, measured, recorded, measured)  # bf16's only
    same = judged_notes(tmp_path, {"a": entry(3.10, XEON, "bf16")}, recorded, {})  # measured on the recording model
    assert not any("kernels' scratch" in note for note in same)


def test_update_loss_references_leaves_a_gpu_case_to_the_gate(tmp_path, monkeypatch):
    """A GPU's loss is noisy and its file has one device: --update-loss-references records CPU references only, and
    a GPU case that ran beside them is judged as usual (here: no baseline), nothing written for it."""
    from types import SimpleNamespace

    monkeypatch.setattr(identity, "device_slug", lambda device: "cpu" if device == "cpu" else "nvidia-h200")
    gate = new_gate(tmp_path, update_loss=True, cpu_model=EPYC)
    node = SimpleNamespace(name="test_x[gpu]", nodeid="bench/x.py::test_x[gpu]")
    assert gate.judge_entry(node, entry(3.0, "NVIDIA H200", "bf16"), "cuda:0").missing
    assert gate.pending == {} and not gate.cases[node.nodeid]["recorded"]
    assert gate.rows[0].verdict.startswith("no baseline")
