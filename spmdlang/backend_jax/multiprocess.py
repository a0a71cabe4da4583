"""Running an emitted module across N local processes, as on N hosts: `--processes N`.

Each process initialises jax.distributed against a coordinator on 127.0.0.1, gets mesh/N virtual
CPU devices and gloo CPU collectives, loads the same module and calls its run(): every process
places only the blocks of the inputs that its own devices hold (inputs are .npy files opened as
memory maps) and receives the global results (gathered with process_allgather). Process 0 writes
them back. This is exactly what a multi-host user does, with processes instead of hosts.

`python -m spmdlang.backend_jax.multiprocess WORKDIR RANK N PORT` is one such process.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import SpmdError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stage(work: Path, source: str, arrays, local_devices: int, xla_flags: bool) -> dict:
    """The children's folder (the module, the inputs as .npy files, the input count and devices
    per process) and their environment: this package importable, XLA_FLAGS kept or not (the
    device count of jax.distributed's processes is their own)."""
    import numpy as np

    (work / "module.py").write_text(source)
    for i, a in enumerate(arrays):
        np.save(work / f"in{i}.npy", _portable(np.asarray(a)))
    (work / "meta").write_text(f"{len(arrays)} {local_devices}")
    env = {k: v for k, v in os.environ.items() if xla_flags or k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    return env


def _results(work: Path) -> list:
    """The global results process 0 (or the one child) wrote, in their own dtypes."""
    import numpy as np

    out = np.load(work / "out.npz")
    return [out[f"out{i}"].astype(_dtype(str(out[f"dtype{i}"]))) for i in range(len(out.files) // 2)]


def run_processes(source: str, arrays, n_devices: int, processes: int, timeout: float = 300.0) -> list:
    """Run module `source` on `arrays` across `processes` local processes; global numpy results."""

    if processes < 1 or n_devices % processes:
        raise SpmdError(f"--processes {processes}: the mesh's {n_devices} devices must split evenly over the "
                        f"processes (each gets mesh/N devices)")
    with tempfile.TemporaryDirectory(prefix="spmdlang-mp-") as tmp:
        work = Path(tmp)
        env = _stage(work, source, arrays, n_devices // processes, xla_flags=False)
        port = _free_port()
        procs = [subprocess.Popen([sys.executable, "-m", "spmdlang.backend_jax.multiprocess", tmp, str(rank),
                                   str(processes), str(port)], env=env, stdout=subprocess.DEVNULL,
                                  stderr=open(work / f"err{rank}.txt", "w"))  # noqa: SIM115
                 for rank in range(processes)]
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise SpmdError(f"--processes {processes}: the processes did not finish within {timeout:.0f} s") from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            log = (work / f"err{failed[0]}.txt").read_text().strip().splitlines()
            tail = "\n".join(line for line in log if not line.startswith("[Gloo]"))[-1500:]
            raise SpmdError(f"--processes {processes}: process {failed[0]} failed:\n{tail}")
        return _results(work)


def run_isolated(source: str, arrays, n_devices: int, timeout: float = 600.0) -> list:
    """Run module `source` on `arrays` in one child process with a jax of its own (n_devices
    devices, as ModuleRunner gets them here), so that XLA aborting the process (a failed CHECK
    in its SPMD partitioner compiling the xla baseline) ends the child, not the caller: an
    XlaAborted error quoting XLA's message. Global numpy results, as ModuleRunner gives."""

    with tempfile.TemporaryDirectory(prefix="spmdlang-iso-") as tmp:
        work = Path(tmp)
        env = _stage(work, source, arrays, n_devices, xla_flags=True)
        with open(work / "err0.txt", "w") as err:
            try:
                p = subprocess.run([sys.executable, "-m", "spmdlang.backend_jax.multiprocess", tmp, "0", "1", "0"],
                                   env=env, stdout=subprocess.DEVNULL, stderr=err, timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                raise SpmdError(f"the run did not finish within {timeout:.0f} s") from None
        if p.returncode != 0:
            log = (work / "err0.txt").read_text().strip().splitlines()
            # XLA's fatal log line ("F1128 ... file.cc:118] Check failed: ...") says what it was
            fatal = [line for line in log if re.match(r"^F\d{4} ", line) or "Check failed" in line]
            refused = [line for line in log if re.match(r"^(jax\.errors\.JaxRuntimeError|jaxlib\S*XlaRuntimeError): ",
                                                         line)]
            if not fatal and refused:  # XLA refused the module (its HLO verifier, say): an error it raised
                raise XlaAborted("XLA failed to compile it: " + refused[-1].split(": ", 1)[1].strip()[-600:])
            if not fatal and p.returncode > 0:  # a Python exception in the child: not XLA's doing
                raise RuntimeError("the isolated run failed:\n" + "\n".join(log[-12:]))
            tail = re.sub(r"^F\d{4} [\d:.]+\s+\d+ ", "", fatal[0]) if fatal else "\n".join(log[-6:])
            tail = tail.strip()[-600:]
            signal = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit status {p.returncode}"
            raise XlaAborted(f"XLA ended the process ({signal}): {tail}")
        return _results(work)


class XlaAborted(SpmdError):
    """The child process of run_isolated ended without results: XLA aborted it (or it failed)."""


def _portable(a):
    """.npy cannot hold ml_dtypes' bfloat16: such arrays travel as float32 (exactly)."""
    return a.astype("float32") if a.dtype.name == "bfloat16" else a


def _dtype(name: str):
    import ml_dtypes
    import numpy as np

    return np.dtype(getattr(ml_dtypes, name)) if name == "bfloat16" else np.dtype(name)


def _worker(work: Path, rank: int, processes: int, port: int) -> None:
    import numpy as np

    n_inputs, local_devices = map(int, (work / "meta").read_text().split())
    if processes == 1:  # run_isolated: one process, the devices as ModuleRunner gets them
        from .runner import ModuleRunner

        arrays = [np.load(work / f"in{i}.npy", mmap_mode="r") for i in range(n_inputs)]
        outs = ModuleRunner((work / "module.py").read_text(), "spmdlang_isolated", local_devices)(arrays)
        np.savez(work / "out.npz", **{f"out{i}": _portable(np.asarray(o)) for i, o in enumerate(outs)},
                 **{f"dtype{i}": np.array(np.asarray(o).dtype.name) for i, o in enumerate(outs)})
        return
    import jax

    jax.config.update("jax_num_cpu_devices", local_devices)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=processes, process_id=rank)
    from .runner import load

    module = load((work / "module.py").read_text(), "spmdlang_mp")
    arrays = [np.load(work / f"in{i}.npy", mmap_mode="r") for i in range(n_inputs)]
    outs = module._leaves(module.run(*module._nest(arrays, module.GLOBAL_SHAPES)), module.RESULT_SHAPES)
    if rank == 0:
        np.savez(work / "out.npz", **{f"out{i}": _portable(o) for i, o in enumerate(outs)},
                 **{f"dtype{i}": np.array(o.dtype.name) for i, o in enumerate(outs)})
    jax.distributed.shutdown()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
