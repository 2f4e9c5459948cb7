"""quantize's pipeline: reading, encoding, measuring and writing overlap,
the output bytes do not depend on it, and memory stays bounded by a few layers."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

import comfyquant
from comfyquant.errors import InputError
from comfyquant.quantizer import runner, work
from kitchen_fixtures import make_weight

LAYERS = tuple((f"blocks.{i}.mlp.fc1", 64, 256) for i in range(5))


def model(path, layers=LAYERS) -> str:
    sd = {}
    for i, (name, n, k) in enumerate(layers):
        w = make_weight(n, k, torch.bfloat16, seed=i)
        if i % 2:  # heavier tails every other layer: each layer's error is its own
            w = (w.float() ** 3).to(torch.bfloat16)
        sd[f"{name}.weight"] = w
        sd[f"{name}.bias"] = torch.zeros(n, dtype=torch.bfloat16)
    save_file(sd, str(path))
    return str(path)


def _wrap(monkeypatch, events: list, encode_hook=None, measure_hook=None) -> None:
    """Record (what, layer) around the encoding and measuring halves of each layer, in the
    order they happen (the list is appended to under the GIL: its order is the order of
    events, whatever the threads' timing)."""
    encode, measure = work.encode_task, work.measure_task

    def encode_task(task):
        events.append(("encode", task["name"]))
        if encode_hook:
            encode_hook(task)
        out = encode(task)
        events.append(("encoded", task["name"]))
        return out

    def measure_task(task, *args):
        events.append(("measure", task["name"]))
        if measure_hook:
            measure_hook(task)
        out = measure(task, *args)
        events.append(("measured", task["name"]))
        return out

    monkeypatch.setattr(work, "encode_task", encode_task)
    monkeypatch.setattr(work, "measure_task", measure_task)


def test_auto_measures_a_layer_while_the_next_one_is_encoded(tmp_path, monkeypatch):
    """The measurement of layer 0 waits until layer 1's encoding has started: run one after
    the other (the in-line measurement of ``--jobs 1``), this could never happen."""
    src = model(tmp_path / "in.safetensors")
    started = threading.Event()
    seen = []

    def on_encode(task):
        if task["name"] == LAYERS[1][0]:
            started.set()

    def on_measure(task):
        if task["name"] == LAYERS[0][0]:
            seen.append(started.wait(30))

    _wrap(monkeypatch, [], on_encode, on_measure)
    r = comfyquant.quantize(src, str(tmp_path / "q.safetensors"), "int8", progress=False)
    assert r.ok and seen == [True]
    assert r.doc["jobs"] == {"requested": "auto", "workers": 0, "threads": None, "overlap": True}


def test_encoder_waits_for_the_measurement_two_layers_back(tmp_path, monkeypatch):
    """Memory bound: the encoder starts layer j only once layer j-2 is measured, so a slow
    measurement never lets encoded layers pile up.  A slow measurement gives an encoder that
    ignored the bound every chance to show it; the order of events, not their times, is
    asserted.  The overlap is proven by a wait: the measurement of layer 1 holds until layer 2's
    encoding has started, which a pipeline that did not overlap could never let happen."""
    src = model(tmp_path / "in.safetensors")
    events: list = []
    names = [name for name, _n, _k in LAYERS]
    third_started = threading.Event()
    overlapped = []

    def on_encode(task):
        if task["name"] == names[2]:
            third_started.set()

    def on_measure(task):
        if task["name"] == names[1]:
            overlapped.append(third_started.wait(30))
        time.sleep(0.05)  # slow: an encoder that ran ahead of the bound would get there

    _wrap(monkeypatch, events, on_encode, on_measure)
    r = comfyquant.quantize(src, str(tmp_path / "q.safetensors"), "int8", jobs="auto", progress=False)
    assert r.ok
    at = {(what, name): i for i, (what, name) in enumerate(events)}
    for j in range(2, len(names)):
        assert at[("encode", names[j])] > at[("measured", names[j - 2])], events
    assert overlapped == [True]  # layer 2 was encoded while layer 1 was measured


def test_output_bytes_and_quality_do_not_depend_on_the_pipeline(tmp_path):
    """--jobs 1 (one thread), auto (threads) and --jobs 2 (processes) write the same bytes, and
    every layer's reported quality is its own: the same numbers one layer measured alone gives."""
    src = model(tmp_path / "in.safetensors")
    outs = {}
    for jobs in (1, 2, "auto"):
        out = tmp_path / f"q{jobs}.safetensors"
        outs[jobs] = comfyquant.quantize(src, str(out), "w4a8", jobs=jobs, progress=False)
    assert (tmp_path / "q1.safetensors").read_bytes() == (tmp_path / "q2.safetensors").read_bytes()
    assert (tmp_path / "q1.safetensors").read_bytes() == (tmp_path / "qauto.safetensors").read_bytes()
    assert [outs[j].doc["jobs"]["workers"] for j in (1, 2, "auto")] == [0, 2, 0]
    rows = {row["layer"]: row for row in outs[1].doc["layers"] if row.get("weight")}
    assert len(rows) == len(LAYERS)
    # Measured alone with --jobs 1's one thread: MKL may split an F32 GEMM's sums by thread
    # count (on AVX2 the figures then move in the 5th-9th digit), so only like is compared.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone_of = {lp.name: work.run_task(work.task_for(lp))["quality"] for lp in outs[1].plan.quantized}
    finally:
        torch.set_num_threads(threads)
    for lp in outs[1].plan.quantized:
        alone = alone_of[lp.name]
        for key in ("weight", "output"):
            assert rows[lp.name][key]["rel_l2"] == pytest.approx(alone[key]["rel_l2"], rel=1e-6)
            assert rows[lp.name][key]["cosine"] == pytest.approx(alone[key]["cosine"], rel=1e-9)
    errors = [rows[name]["weight"]["rel_l2"] for name, _n, _k in LAYERS]
    assert len({round(e, 6) for e in errors}) > 1  # the layers really differ, so a mix-up would show
    work.close_sources()


def test_on_layer_sees_every_layer_in_file_order_with_its_quality(tmp_path):
    src = model(tmp_path / "in.safetensors")
    seen = []
    comfyquant.quantize(
        src,
        str(tmp_path / "q.safetensors"),
        "fp8",
        jobs=1,
        progress=False,
        on_layer=lambda lp, res: seen.append((lp.name, res["quality"]["weight"]["rel_l2"] > 0)),
    )
    assert seen == [(name, True) for name, _n, _k in LAYERS]


@pytest.mark.parametrize("jobs", [1, "auto"])
def test_a_failed_measurement_fails_the_run_and_leaves_nothing(tmp_path, monkeypatch, jobs):
    src = model(tmp_path / "in.safetensors")
    out = tmp_path / "out"
    out.mkdir()

    def boom(task):
        if task["name"] == LAYERS[1][0]:
            raise InputError(f"layer {task['name']!r}: measurement failed")

    _wrap(monkeypatch, [], measure_hook=boom)
    with pytest.raises(InputError, match="measurement failed"):
        comfyquant.quantize(src, str(out / "q.safetensors"), "int8", jobs=jobs, progress=False)
    assert os.listdir(out) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("comfyquant-")]  # threads joined


def test_a_failed_encode_fails_the_run_with_its_one_line_error(tmp_path):
    layers = LAYERS[:3]
    sd = {f"{name}.weight": make_weight(n, k, torch.bfloat16, seed=i) for i, (name, n, k) in enumerate(layers)}
    sd[f"{layers[2][0]}.weight"][3, 7] = float("nan")
    save_file(sd, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError, match=r"NaN/Inf.*\[3, 7\].*--keep-bad"):
        comfyquant.quantize(str(tmp_path / "in.safetensors"), str(out / "q.safetensors"), "w4a8", jobs=1, progress=False)
    assert os.listdir(out) == []


def test_queued_layers_are_read_ahead(tmp_path, monkeypatch):
    """Each quantized layer's weight bytes are announced to the kernel (WILLNEED) before the
    layer before it has finished encoding, so reading overlaps encoding.  Proven by a wait, not
    by clocks: the encoding of each layer does not finish until the next layer's bytes have
    been announced, which a pipeline that announced a layer only when its turn came could
    never let happen (the wait would end empty-handed)."""
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise on this platform")
    src = model(tmp_path / "in.safetensors")
    real = os.posix_fadvise
    advised: list = []
    announced = threading.Condition()
    layer_ranges: dict = {}  # layer name -> (offset, length) of its weight, from the file
    names = [name for name, _n, _k in LAYERS]

    def advise(fd, offset, length, advice):
        with announced:
            advised.append((offset, length))
            announced.notify_all()
        return real(fd, offset, length, advice)

    import json
    import struct

    with open(src, "rb") as fh:  # each weight's bytes, from the file's own header
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    for name in names:
        a, b = header[f"{name}.weight"]["data_offsets"]
        layer_ranges[name] = (8 + n + a, b - a)

    waited = {}
    encode = work.encode_task

    def encode_task(task):
        out = encode(task)
        following = names.index(task["name"]) + 1
        if following < len(names):
            want = layer_ranges[names[following]]
            with announced:
                waited[task["name"]] = announced.wait_for(lambda: want in advised, timeout=30)
        return out

    monkeypatch.setattr(os, "posix_fadvise", advise)
    monkeypatch.setattr(work, "encode_task", encode_task)
    r = comfyquant.quantize(src, str(tmp_path / "q.safetensors"), "int8", jobs=1, progress=False)
    ranges = {lp.name: (lp.entries["weight"].start, lp.entries["weight"].nbytes) for lp in r.plan.quantized}
    assert ranges == layer_ranges and set(advised) == set(ranges.values())
    assert waited == {name: True for name in names[:-1]}


def test_workers_take_layers_ahead_of_the_writer(tmp_path, monkeypatch):
    """--jobs N keeps 2N layers submitted: a worker done with a short layer starts the next one
    instead of waiting until the writer has written the layer before it."""
    src = model(tmp_path / "in.safetensors")
    in_flight = []
    start = runner._Pool.start

    def record(self, order):
        start(self, order)
        in_flight.append(len(self.futures))

    monkeypatch.setattr(runner._Pool, "start", record)
    r = comfyquant.quantize(src, str(tmp_path / "q.safetensors"), "int8", jobs=2, progress=False)
    assert r.ok and in_flight == [4]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # every spill file removed


def test_jobs1_computes_on_one_core(tmp_path, monkeypatch):
    """--jobs 1 is one core: one torch thread, and each layer is encoded and then measured by
    the same thread (never two layers' work at once); the caller's thread count comes back."""
    src = model(tmp_path / "in.safetensors")
    events: list = []
    seen = []

    def hook(task):
        seen.append((threading.current_thread().name, torch.get_num_threads()))

    _wrap(monkeypatch, events, encode_hook=hook, measure_hook=hook)
    before = torch.get_num_threads()
    r = comfyquant.quantize(src, str(tmp_path / "q.safetensors"), "int8", jobs=1, progress=False)
    assert r.ok and torch.get_num_threads() == before
    assert r.doc["jobs"] == {"requested": "1", "workers": 0, "threads": 1, "overlap": False}
    assert len(seen) == 2 * len(LAYERS) and {t for _name, t in seen} == {1}
    assert len({name for name, _t in seen}) == 1 and seen[0][0].startswith("comfyquant-encode")
    order = list(events)  # (what, layer) in the order it happened
    names = [name for name, _n, _k in LAYERS]
    assert order == [(what, name) for name in names for what in ("encode", "encoded", "measure", "measured")]


def _plan_of(tmp_path, fmt: str, layers=LAYERS):
    src = model(tmp_path / "in.safetensors", layers)
    return comfyquant.quantize(src, None, fmt, dry_run=True, progress=False).plan


def test_auto_starts_a_worker_per_core_only_for_enough_heavy_encoding(tmp_path, monkeypatch):
    """auto: worker processes (one per core, capped by layers and memory) when slow encoders
    carry enough work to pay for starting them; this process with every core otherwise."""
    from comfyquant.quantizer import jobs as jobs_mod

    w4a8 = _plan_of(tmp_path, "w4a8")
    fp8 = _plan_of(tmp_path, "fp8")
    heavy = sum(lp.n * lp.k * 2 for lp in w4a8.quantized)
    monkeypatch.setattr(jobs_mod, "cores", lambda: 4)
    assert jobs_mod.resolve(None, w4a8).workers == 0  # far below the threshold: no workers
    monkeypatch.setattr(jobs_mod, "POOL_MIN_BYTES", heavy)
    assert jobs_mod.resolve("auto", w4a8) == jobs_mod.Jobs(4, 1, False, "auto")
    assert jobs_mod.resolve("auto", fp8).workers == 0  # a fast encoder: reading and writing dominate
    assert jobs_mod.resolve("auto", w4a8, in_process_only=True).workers == 0
    monkeypatch.setattr(jobs_mod, "_memory_cap", lambda largest: 3)
    assert jobs_mod.resolve("auto", w4a8).workers == 3
    monkeypatch.setattr(jobs_mod, "cores", lambda: 1)
    assert jobs_mod.resolve("auto", w4a8) == jobs_mod.Jobs(0, None, True, "auto")
    monkeypatch.setattr(jobs_mod, "cores", lambda: 8)
    assert jobs_mod.resolve(2, w4a8) == jobs_mod.Jobs(2, 4, False, "2")
    assert jobs_mod.resolve("3", w4a8, in_process_only=True) == jobs_mod.Jobs(0, 3, True, "3")
    assert jobs_mod.resolve(1, w4a8) == jobs_mod.Jobs(0, 1, False, "1")


def test_auto_with_workers_writes_the_same_bytes(tmp_path, monkeypatch):
    from comfyquant.quantizer import jobs as jobs_mod

    src = model(tmp_path / "in.safetensors")
    monkeypatch.setattr(jobs_mod, "POOL_MIN_BYTES", 1)
    monkeypatch.setattr(jobs_mod, "cores", lambda: 2)
    auto = comfyquant.quantize(src, str(tmp_path / "a.safetensors"), "w4a8", progress=False)
    one = comfyquant.quantize(src, str(tmp_path / "b.safetensors"), "w4a8", jobs=1, progress=False)
    assert auto.doc["jobs"]["workers"] == 2 and one.doc["jobs"]["workers"] == 0
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


@pytest.mark.parametrize("value", [0, -1, "x", "1.5", True])
def test_bad_jobs_are_refused_before_any_work(tmp_path, value):
    src = model(tmp_path / "in.safetensors")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError, match="^jobs must"):  # the API's keyword (the CLI says --jobs)
        comfyquant.quantize(src, str(out / "q.safetensors"), "int8", jobs=value, progress=False)
    assert os.listdir(out) == []


def test_auto_with_workers_leaves_torch_out_of_the_writing_process(tmp_path):
    """With workers, the main process only writes: deciding auto must not import torch there
    (it cost the run a torch import and ~200 MiB beside two workers)."""
    import json
    import subprocess
    import sys

    src = model(tmp_path / "in.safetensors")
    code = (
        "import json, sys, comfyquant\n"
        "from comfyquant.quantizer import jobs\n"
        "jobs.POOL_MIN_BYTES = 1\n"
        "jobs.cores = lambda: 2\n"
        f"r = comfyquant.quantize({src!r}, {str(tmp_path / 'q.safetensors')!r}, 'w4a8', progress=False)\n"
        "print(json.dumps({'jobs': r.doc['jobs'], 'torch': 'torch' in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"jobs": {"requested": "auto", "workers": 2, "threads": 1, "overlap": False}, "torch": False}


def test_a_script_without_a_main_guard_runs_its_top_level_once(tmp_path):
    """Worker processes must not import the caller's script again: spawn's default re-ran its
    top-level code in every worker, and a top-level ``quantize`` call (no ``if __name__ ==
    "__main__"`` guard: the API's ``auto`` starts workers for heavy formats) made each worker
    call it again, which multiprocessing refuses: the run failed with "a worker process died"."""
    import subprocess
    import sys

    src = model(tmp_path / "in.safetensors")
    log = tmp_path / "ran.log"
    script = tmp_path / "convert_my_model.py"
    script.write_text(
        "import comfyquant\n"
        f"with open({str(log)!r}, 'a') as fh:\n"
        "    fh.write('top level\\n')\n"
        f"r = comfyquant.quantize({src!r}, {str(tmp_path / 'q.safetensors')!r}, 'w4a8', jobs=2, progress=False)\n"
        "print(r.ok, r.doc['jobs']['workers'])\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "2"]
    assert log.read_text() == "top level\n"  # the workers did not run the script again
    want = comfyquant.quantize(src, str(tmp_path / "one.safetensors"), "w4a8", jobs=1, progress=False)
    assert want.ok
    assert (tmp_path / "q.safetensors").read_bytes() == (tmp_path / "one.safetensors").read_bytes()


def test_no_more_workers_start_than_layers_to_compute(tmp_path, monkeypatch):
    """Workers start when the pool is made (interpreter and torch import, not at their first
    layer); --jobs 4 on two layers must not start two that would get nothing to do."""
    from comfyquant.quantizer import spawn

    src = model(tmp_path / "in.safetensors", LAYERS[:2])
    started = []
    real = spawn._BareMainProcess.start

    def count(self):
        started.append(1)
        return real(self)

    monkeypatch.setattr(spawn._BareMainProcess, "start", count)
    r = comfyquant.quantize(src, str(tmp_path / "q.safetensors"), "int8", jobs=4, progress=False)
    assert r.ok and r.doc["jobs"]["workers"] == 2 and r.doc["jobs"]["requested"] == "4"
    assert len(started) == 2
    one = comfyquant.quantize(src, str(tmp_path / "one.safetensors"), "int8", jobs=1, progress=False)
    assert one.ok
    assert (tmp_path / "q.safetensors").read_bytes() == (tmp_path / "one.safetensors").read_bytes()


def _workers_of(pid: int) -> list[int]:
    """The quantize worker processes (multiprocessing spawn children) of process ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry))
    return found


def _maps_torch(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return "libtorch" in fh.read()
    except OSError:
        return False


def _quantize_in_own_session(src, out):
    """``quantize --format w4a8 --jobs 2`` as a terminal starts it, in a process group of its own
    (so a test's SIGINT to the group is a Ctrl-C), its output captured."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "comfyquant", "quantize", src, "-o", str(out), "--format", "w4a8"]
    return subprocess.Popen(
        [*command, "--jobs", "2", "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc and process groups")
def test_ctrl_c_while_workers_start_prints_one_line_and_leaves_nothing(tmp_path):
    """Ctrl-C reaches the whole process group.  A worker interrupted while it started (importing
    torch) printed a KeyboardInterrupt traceback beside the main process's one-line report."""
    import signal

    src = model(tmp_path / "in.safetensors")
    proc = _quantize_in_own_session(src, tmp_path / "q.safetensors")
    deadline = time.monotonic() + 120
    # interrupted once every worker has loaded torch's library: they are inside `import torch`
    # (its Python modules take a second or more after the library), where a traceback would show
    while (
        not (len(_workers_of(proc.pid)) == 2 and all(_maps_torch(w) for w in _workers_of(proc.pid)))
        and proc.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before its workers started"
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C does
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1] == "comfyquant: interrupted"
    assert sorted(os.listdir(tmp_path)) == ["in.safetensors"]


def test_an_interrupted_worker_computes_none_of_its_queued_layers(tmp_path, monkeypatch):
    """After Ctrl-C (or the pool's close after an error) a worker's queued layers end at once
    instead of being computed for nobody: closing the pool waited 2-5 s for them."""
    plan = _plan_of(tmp_path, "int8")
    task = work.task_for(plan.quantized[0], False, None)
    spills = tmp_path / "spills"
    spills.mkdir()
    monkeypatch.setattr(work, "_STOPPING", True)
    with pytest.raises(KeyboardInterrupt):
        work.run_task_spilled(task, str(spills))
    assert not os.listdir(spills)  # nothing computed, nothing written
    monkeypatch.setattr(work, "_STOPPING", False)
    out = work.run_task_spilled(task, str(spills))  # not interrupted: computed and spilled
    assert os.listdir(spills) == [os.path.basename(out["spill"])] and out["tensors"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc and process groups")
def test_ctrl_c_while_workers_compute_stops_at_once_and_leaves_nothing(tmp_path):
    import signal

    layers = tuple((f"blocks.{i}.mlp.fc1", 1024, 3072) for i in range(12))
    src = model(tmp_path / "in.safetensors", layers)
    proc = _quantize_in_own_session(src, tmp_path / "q.safetensors")
    deadline = time.monotonic() + 120
    # a first layer handed over (a spill file next to the output): the workers are computing
    while not [n for n in os.listdir(tmp_path) if n.endswith(".spill")] and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before its workers computed"
    os.killpg(proc.pid, signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1] == "comfyquant: interrupted"
    assert sorted(os.listdir(tmp_path)) == ["in.safetensors"]
    assert not _workers_of(proc.pid)


def test_a_worker_interrupted_before_its_result_is_delivered_removes_the_spill(tmp_path, monkeypatch):
    """Between returning a layer and the pool's delivery of it, an interruption removes the
    spill file (the run is being abandoned: it would be left next to the output) and marks the
    worker stopping; the worker itself stays until the pool ends it (see the next test)."""
    spill = tmp_path / ".comfyquant-x.spill"
    spill.write_bytes(b"encoded layer")
    monkeypatch.setattr(work, "_SENT_SPILL", str(spill))
    monkeypatch.setattr(work, "_IN_TASK", False)
    monkeypatch.setattr(work, "_STOPPING", False)

    def leave():
        raise AssertionError("an idle worker left at an interruption")

    monkeypatch.setattr(work, "_leave_now", leave)
    assert work._interrupted(2, None) is None
    assert not spill.exists() and work._STOPPING
    monkeypatch.setattr(work, "_IN_TASK", True)  # during a task: the task stops (and cleans up) itself
    with pytest.raises(KeyboardInterrupt):
        work._interrupted(2, None)


@pytest.mark.needs_torch
def test_idle_workers_interrupted_leave_the_pool_working(tmp_path):
    """An idle worker waits in the pool's call queue holding that queue's lock, a semaphore all
    workers share. A worker that ended at a SIGINT there left the lock held: the other workers
    then waited for it forever, and so did the pool's shutdown (a Ctrl-C that never returned).
    Interrupted while idle, every worker stays usable and the pool closes."""
    pool = runner._Pool(2, 1, False, str(tmp_path))
    try:
        pids = {pool.pool.submit(os.getpid).result(timeout=300) for _ in range(8)}
        workers = [p.pid for p in pool.pool._processes.values()]
        for pid in workers:
            os.kill(pid, signal.SIGINT)
        done = [pool.pool.submit(os.getpid) for _ in range(4)]
        assert {f.result(timeout=300) for f in done} <= set(workers)
    finally:
        pool.close()
    assert pids <= set(workers)


def _worker_task(tmp_path, monkeypatch):
    """A planned INT8 layer's task and an empty spill folder, in a worker not interrupted yet."""
    plan = _plan_of(tmp_path, "int8")
    spills = tmp_path / "spills"
    spills.mkdir()
    monkeypatch.setattr(work, "_STOPPING", False)
    monkeypatch.setattr(work, "_SENT_SPILL", None)
    return work.task_for(plan.quantized[0], False, None), spills


def test_a_second_interrupt_does_not_cut_the_spill_clean_up_short(tmp_path, monkeypatch):
    """Ctrl-C reaches a worker twice (the process group, then the main process's interruption
    of its workers): the second SIGINT arriving while the first one's KeyboardInterrupt removes
    the half-written spill file must not raise again inside that clean-up, which left the file
    next to the output."""
    task, spills = _worker_task(tmp_path, monkeypatch)
    real_fdopen, real_unlink = os.fdopen, os.unlink

    class Interrupted:
        """The spill file, interrupted (the first SIGINT) at its first write."""

        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def tell(self):
            return self.fh.tell()

        def write(self, data):
            self.fh.write(bytes(data)[:10])
            work._interrupted(2, None)

    def second_then_unlink(path, *args, **kwargs):
        work._interrupted(2, None)  # the second SIGINT, right at the clean-up
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(work.os, "fdopen", lambda fd, mode: Interrupted(real_fdopen(fd, mode)))
    monkeypatch.setattr(work.os, "unlink", second_then_unlink)
    with pytest.raises(KeyboardInterrupt):
        work.run_task_spilled(task, str(spills))
    assert not os.listdir(spills)


def test_an_interrupt_while_the_spill_file_is_created_removes_it(tmp_path, monkeypatch):
    """A SIGINT landing inside the creation of the spill file (after the file exists, before
    its name is returned) would have raised where nobody knows the name: the file was left
    next to the output.  The interruption waits until the name is known, then the task stops
    and removes the file."""
    from comfyquant.io import tempfiles

    task, spills = _worker_task(tmp_path, monkeypatch)
    real = tempfiles.make_temp
    made = []

    def interrupted_inside(folder, suffix=".tmp"):
        fd, path = real(folder, suffix)
        made.append(path)
        work._interrupted(2, None)  # the signal, after the file exists
        return fd, path

    monkeypatch.setattr(tempfiles, "make_temp", interrupted_inside)
    with pytest.raises(KeyboardInterrupt):
        work.run_task_spilled(task, str(spills))
    assert len(made) == 1 and not os.listdir(spills)
    assert not work._IN_TASK and not work._CREATING


def test_an_interrupt_once_the_result_is_complete_removes_its_spill(tmp_path, monkeypatch):
    """An interruption after the task's result is complete but while the task is still
    returning it: the task stops and its spill file, which nobody will read, goes."""
    spill = tmp_path / ".comfyquant-y.spill"
    spill.write_bytes(b"encoded layer")
    monkeypatch.setattr(work, "_SENT_SPILL", str(spill))
    monkeypatch.setattr(work, "_IN_TASK", True)
    monkeypatch.setattr(work, "_RAISED", False)
    monkeypatch.setattr(work, "_STOPPING", False)
    with pytest.raises(KeyboardInterrupt):
        work._interrupted(2, None)
    assert not spill.exists()
    work._interrupted(2, None)  # a second one during the clean-up returns


def _pool_with_a_spilled_layer(tmp_path, name: str):
    """A ``--jobs`` pool (no processes) whose one future, layer ``name``, was delivered with
    its spill file; and that file."""
    from concurrent.futures import Future

    spill = tmp_path / ".comfyquant-z.spill"
    spill.write_bytes(b"encoded layer")
    done: Future = Future()
    done.set_result({"spill": str(spill), "tensors": {}, "quality": None})
    pool = object.__new__(runner._Pool)
    pool.futures, pool.order, pool.next, pool.jobs = {name: done}, [], 0, 1
    pool.pool = SimpleNamespace(shutdown=lambda **kwargs: None)
    return pool, spill


def test_an_interrupt_while_a_spill_is_taken_over_leaves_it_to_close(tmp_path, monkeypatch):
    """Ctrl-C in the main process between a worker's delivered result and the opening of its
    spill file: the layer goes back among the pool's futures, and closing the pool removes the
    file (it was left next to the output)."""
    pool, spill = _pool_with_a_spilled_layer(tmp_path, "a")

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "_open_spill", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.result(SimpleNamespace(name="a"))
    pool.close()
    assert not spill.exists()


def test_an_interrupt_while_the_next_layers_are_queued_leaves_the_awaited_one_to_close(tmp_path):
    """Ctrl-C in the main process while it queues the next layers (reading hints, handing a
    task to the pool) just after taking the awaited layer's future: the layer goes back among
    the pool's futures, so closing the pool removes its spill file.  Its worker may already be
    computing another layer, so it no longer removes this one itself."""
    pool, spill = _pool_with_a_spilled_layer(tmp_path, "a")

    def interrupted():
        raise KeyboardInterrupt

    pool._fill = interrupted
    with pytest.raises(KeyboardInterrupt):
        pool.result(SimpleNamespace(name="a"))
    pool.close()
    assert not spill.exists()
