"""``spec-hal compile-matrix``: compile every Triton kernel for GPU targets without a GPU.

For each target (``sm_80``, ``sm_90``, ``sm_100``, ``gfx90a``, ``gfx942``, ``gfx950``) and each
module in ``spec_hal.kernels.KERNEL_MODULES``, ``compile_specs(KernelTarget.for_arch(arch))``
lists every (kernel, signature, constexprs, num_warps[, attrs[, options]]) the backends launch there. Each
is built with ``triton.compile(ASTSource(...), target=GPUTarget(...))`` (the real GPU compiler,
never the interpreter) and its resources are read from the binary Triton produced:

* NVIDIA: registers and the per-thread local-memory frame from the cubin's ``.nv.info`` section
  (``EIATTR_REGCOUNT``, ``EIATTR_FRAME_SIZE``; the same numbers ``cuobjdump -res-usage`` prints),
  shared memory from Triton's metadata. ptxas does not record spill bytes in the cubin, but
  spills live in the local frame: a frame > 0 fails as "spills or local memory". This needs no
  tool beyond Triton and reads the exact cubin Triton built, on Triton 3.6 and 3.9 alike.
* AMD: VGPR/AGPR/SGPR counts, VGPR/SGPR spill counts, scratch (private segment) and LDS
  (group segment) from the AMDGPU metadata in the ``amdgcn`` assembly text.

A kernel fails on spills (or local/scratch memory), on shared memory/LDS over the target's
per-program limit (``ARCH_TABLE``), on more than 1024 threads per program, and on NVIDIA when
registers x threads exceed the 64K-register file one block may use, and when one compile takes
longer than ``--timeout`` seconds (it is stopped). Known findings are data
(``ci/xfail/compile-matrix.toml``, entries with reason and link): ``xfail`` entries are compiled
and expected to fail on a resource limit (a compile error or timeout still fails), ``skip``
entries are not compiled (too slow to compile in CI). Identical
compiles are deduplicated; compiles run in ``--jobs`` fresh processes; Triton's on-disk cache
makes repeated runs fast. Exit status: 0 every kernel within limits (or failing as listed), 1 a
failure, 2 a usage error, 6 a stale known-issue entry (it matches nothing, or its compiles pass).
"""
from __future__ import annotations

import fnmatch
import importlib
import json
import multiprocessing
import os
import queue
import re
import struct
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Optional, Sequence

from .capabilities import ARCH_TABLE

DEFAULT_TARGETS = ("sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx950")
NVIDIA_REGISTERS_PER_BLOCK = 65536
DEFAULT_TIMEOUT_S = 120.0  # one kernel compiling longer stalls an engine's first request that long

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # spec_hal.cli's exit codes
EXIT_STALE = 6  # as in the conformance suite: a known-issue entry matches nothing or now passes


@dataclass(frozen=True)
class CompileJob:
    """One distinct compile: ``spec_index`` into ``module.compile_specs(KernelTarget.for_arch(arch))``."""

    module: str
    spec_index: int
    kernel: str
    arch: str
    num_warps: int
    signature: str
    constexprs: str
    options: str
    known_issue: Optional[str] = None  # the manifest's "xfail: reason (link)" / "skip: ...", set before compiling

    @property
    def skipped(self) -> bool:
        return bool(self.known_issue and self.known_issue.startswith("skip"))


@dataclass
class KernelResources:
    """What one compiled kernel uses on one target, and why it fails (``problems``)."""

    module: str
    kernel: str
    arch: str
    num_warps: int
    threads: int
    constexprs: str
    signature: str
    options: str
    shared_bytes: int = 0
    shared_limit_bytes: int = 0
    registers: Optional[int] = None  # NVIDIA registers per thread; AMD VGPRs per lane (incl. AGPRs)
    agprs: Optional[int] = None
    sgprs: Optional[int] = None
    spills: Optional[int] = None  # AMD: VGPR + SGPR spill count; NVIDIA: not recorded (see frame)
    local_bytes: Optional[int] = None  # NVIDIA local frame / AMD scratch bytes per thread
    compile_s: float = 0.0
    error: Optional[str] = None
    problems: list = field(default_factory=list)
    known_issue: Optional[str] = None  # "xfail: reason (link)" / "skip: reason (link)" from the manifest

    @property
    def ok(self) -> bool:
        return self.error is None and not self.problems

    @property
    def outcome(self) -> str:
        """pass, fail, xfail (fails as the manifest expects), xpass (listed but passes: stale), skipped.

        An xfail entry covers resource findings only (spills, frames, shared memory, registers,
        threads): a compile that raises or runs past the timeout fails even when listed, so an
        entry kept for a frame cannot hide a kernel that stopped compiling."""
        if self.known_issue and self.known_issue.startswith("skip"):
            return "skipped"
        if self.known_issue and self.error is None:
            return "xfail" if self.problems else "xpass"
        return "pass" if self.ok else "fail"


def gpu_target(arch: str):
    """``triton.backends.compiler.GPUTarget`` for "sm_90" / "gfx942" style names."""
    from triton.backends.compiler import GPUTarget

    if arch.startswith("gfx"):
        return GPUTarget("hip", arch, 64)
    if re.fullmatch(r"sm_\d+", arch):
        return GPUTarget("cuda", int(arch[3:]), 32)
    raise ValueError(f"unknown target {arch!r}: use sm_XY (NVIDIA) or gfxNNN (AMD)")


# --- NVIDIA: cubin ELF .nv.info attributes -------------------------------------------------------

_EIFMT_SVAL = 0x04
_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11


def _elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name to contents of a little-endian ELF64 file (a cubin)."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 file")
    (section_offset,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size) for i in range(count)]
    names_at = headers[names_index][4]
    sections = {}
    for name_offset, _type, _flags, _addr, offset, size, *_ in headers:
        start = names_at + name_offset
        sections[data[start:data.index(b"\0", start)].decode()] = data[offset:offset + size]
    return sections


def _nv_info_attributes(blob: bytes):
    """(attribute, payload) pairs of an .nv.info section; SVAL payloads are bytes."""
    position = 0
    while position + 4 <= len(blob):
        fmt, attribute, value = struct.unpack_from("<BBH", blob, position)
        if fmt == _EIFMT_SVAL:
            yield attribute, blob[position + 4:position + 4 + value]
            position += 4 + value
        else:
            yield attribute, value
            position += 4


def cubin_resources(cubin: bytes) -> dict:
    """``{"registers": int, "local_bytes": int}`` of the (single) kernel in a cubin."""
    registers = local_bytes = None
    for name, blob in _elf_sections(cubin).items():
        if not name.startswith(".nv.info"):
            continue
        for attribute, payload in _nv_info_attributes(blob):
            if attribute in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and isinstance(payload, bytes) and len(payload) == 8:
                _function, value = struct.unpack("<II", payload)
                if attribute == _EIATTR_REGCOUNT:
                    registers = max(registers or 0, value)
                else:
                    local_bytes = max(local_bytes or 0, value)
    if registers is None:
        raise ValueError("cubin has no EIATTR_REGCOUNT attribute")
    return {"registers": registers, "local_bytes": local_bytes or 0}


# --- AMD: AMDGPU metadata in the amdgcn text --------------------------------------------------------

_AMD_KEYS = {
    "registers": ".vgpr_count",
    "agprs": ".agpr_count",
    "sgprs": ".sgpr_count",
    "vgpr_spills": ".vgpr_spill_count",
    "sgpr_spills": ".sgpr_spill_count",
    "lds_bytes": ".group_segment_fixed_size",
    "local_bytes": ".private_segment_fixed_size",
}


def amdgcn_resources(text: str) -> dict:
    """Resource counts from the ``amdhsa.kernels`` metadata of an amdgcn assembly listing."""
    found = {}
    for name, key in _AMD_KEYS.items():
        match = re.search(re.escape(key) + r":\s+(\d+)", text)
        if match is None and name != "agprs":  # .agpr_count exists only on MI100 and later
            raise ValueError(f"amdgcn metadata has no {key}")
        found[name] = int(match.group(1)) if match else None
    return found


# --- limits -----------------------------------------------------------------------------------------


def check_limits(resources: KernelResources) -> list[str]:
    """Why ``resources`` cannot run well (or at all) on its arch; empty when within limits."""
    problems = []
    if resources.spills:
        problems.append(f"{resources.spills} register spills")
    if resources.local_bytes:
        kind = "scratch" if resources.arch.startswith("gfx") else "local-memory frame (register spills or a local array)"
        problems.append(f"{resources.local_bytes} B {kind} per thread")
    if resources.shared_bytes > resources.shared_limit_bytes:
        problems.append(f"shared memory {resources.shared_bytes} B > limit {resources.shared_limit_bytes} B")
    info = ARCH_TABLE.get(resources.arch)
    max_threads = info.max_threads_per_program if info else 1024
    if resources.threads > max_threads:
        problems.append(f"{resources.threads} threads per program > {max_threads}")
    if not resources.arch.startswith("gfx") and resources.registers is not None:
        if resources.registers * resources.threads > NVIDIA_REGISTERS_PER_BLOCK:
            problems.append(f"{resources.registers} registers x {resources.threads} threads > {NVIDIA_REGISTERS_PER_BLOCK}")
    return problems


# --- known issues (ci/xfail/compile-matrix.toml) ------------------------------------------------------


def default_known_issues() -> Optional[str]:
    """The manifest applied unless ``--strict``: ``ci/xfail/compile-matrix.toml`` of a source
    checkout, else the copy installed with the package (``spec_hal.known_issues``)."""
    checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ci", "xfail",
                            "compile-matrix.toml")
    if os.path.isfile(checkout):
        return checkout
    try:
        from importlib.resources import files

        installed = files("spec_hal.known_issues") / "compile-matrix.toml"
        return str(installed) if installed.is_file() else None
    except (ModuleNotFoundError, TypeError):
        return None


def load_known_issues(path: str) -> list[dict]:
    """Entries ``{kernel, targets?, constexprs?, action, reason, link}``; see docs/compile-matrix.md.

    A constexpr value may be a list: any of its values matches. ``triton`` (a version specifier such
    as ``"<3.9"``) limits an entry to some Triton versions; under others it is inactive (neither
    matched nor stale).
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(path, "rb") as handle:
        entries = tomllib.load(handle).get("known_issue", [])
    for number, entry in enumerate(entries):
        missing = [key for key in ("kernel", "action", "reason", "link") if not entry.get(key)]
        if missing:
            raise ValueError(f"{path}: known_issue {number} lacks {', '.join(missing)}")
        if entry["action"] not in ("xfail", "skip"):
            raise ValueError(f"{path}: known_issue {number}: action must be xfail or skip, not {entry['action']!r}")
        unknown = set(entry) - {"kernel", "targets", "constexprs", "triton", "action", "reason", "link"}
        if unknown:
            raise ValueError(f"{path}: known_issue {number} has unknown keys {sorted(unknown)}")
    return entries


def active_known_issues(entries: Sequence[dict], triton_version: str) -> list[dict]:
    """The entries that apply to ``triton_version``."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    version = Version(triton_version)
    return [entry for entry in entries if version in SpecifierSet(entry.get("triton", ""), prereleases=True)]


def _matches(entry: dict, job: CompileJob) -> bool:
    qualified = job.module.rsplit(".", 1)[-1] + "." + job.kernel
    if not fnmatch.fnmatch(qualified, entry["kernel"]):
        return False
    if not any(fnmatch.fnmatch(job.arch, pattern) for pattern in entry.get("targets", ["*"])):
        return False
    constexprs = json.loads(job.constexprs)
    return all(constexprs.get(name) in (value if isinstance(value, list) else [value])
               for name, value in entry.get("constexprs", {}).items())


def known_issue_for(entries: list[dict], job: CompileJob) -> Optional[dict]:
    return next((entry for entry in entries if _matches(entry, job)), None)


def _in_scope(entry: dict, jobs: list[CompileJob]) -> bool:
    """Whether this run compiles anything the entry could be about: one of its targets and its
    kernel module. An entry for gfx942 is not stale in a ``--targets sm_90`` run (the shipped
    manifest is applied by default, whatever subset of targets and modules is asked for)."""
    modules = {job.module.rsplit(".", 1)[-1] for job in jobs}
    archs = {job.arch for job in jobs}
    module_pattern = entry["kernel"].split(".", 1)[0]
    return (any(fnmatch.fnmatch(module, module_pattern) for module in modules)
            and any(fnmatch.fnmatch(arch, pattern) for arch in archs for pattern in entry.get("targets", ["*"])))


def stale_entries(entries: list[dict], jobs: list[CompileJob], results: list[KernelResources]) -> list[str]:
    """Entries in scope of this run (:func:`_in_scope`) that match no compile, or whose every
    compiled match now passes."""
    stale = []
    for entry in entries:
        if not _in_scope(entry, jobs):
            continue
        matched = [result for job, result in zip(jobs, results) if known_issue_for(entries, job) is entry]
        if not matched:
            stale.append(f"known issue {entry['kernel']} {entry.get('constexprs', {})} matches no compile")
        elif entry["action"] == "xfail" and all(result.ok for result in matched):
            stale.append(f"known issue {entry['kernel']} {entry.get('constexprs', {})}: every match now passes")
    return stale


# --- collecting and compiling -------------------------------------------------------------------


def _spec_parts(spec) -> tuple:
    """(kernel, signature, constexprs, num_warps, attrs, options) of a compile_specs entry.

    The optional fifth element holds ``ASTSource`` attrs (argument position to specialisations
    such as ``[["tt.divisibility", 16]]``), as ``kernels.launch.runtime_specialized`` builds them
    to reproduce what Triton's JIT does at launch time (None or none: a generic launch); the
    optional sixth, extra compile options
    (``maxnreg``, ``waves_per_eu``)."""
    kernel, signature, constexprs, num_warps = spec[:4]
    attrs = dict(spec[4] or {}) if len(spec) > 4 else {}
    options = dict(spec[5]) if len(spec) > 5 else {}
    return kernel, signature, constexprs, num_warps, attrs, options


def _kernel_name(kernel) -> str:
    return getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", repr(kernel))


def _specs(module_name: str, arch: str) -> list:
    from spec_hal.kernels.launch import KernelTarget

    return list(importlib.import_module(module_name).compile_specs(KernelTarget.for_arch(arch)))


def collect_jobs(module_names: Sequence[str], archs: Sequence[str],
                 smoke_archs: Sequence[str] = ()) -> tuple[list[CompileJob], int]:
    """Distinct compiles over modules x archs, and how many specs were listed before deduplication.

    On ``smoke_archs`` (a subset of ``archs``) only the first spec each module lists for a kernel
    is kept: a build check of every kernel at one launch configuration."""
    jobs: dict[tuple, CompileJob] = {}
    listed = 0
    for arch in archs:
        for module_name in module_names:
            kernels_seen = set()
            for index, spec in enumerate(_specs(module_name, arch)):
                listed += 1
                kernel, signature, constexprs, num_warps, attrs, options = _spec_parts(spec)
                if arch in smoke_archs and _kernel_name(kernel) in kernels_seen:
                    continue
                kernels_seen.add(_kernel_name(kernel))
                job = CompileJob(
                    module=module_name, spec_index=index, kernel=_kernel_name(kernel), arch=arch, num_warps=int(num_warps),
                    signature=json.dumps(signature, sort_keys=True), constexprs=json.dumps(constexprs, sort_keys=True, default=str),
                    options=json.dumps(options, sort_keys=True) + (f" attrs={sorted(attrs.items())}" if attrs else ""),
                )
                key = (job.module, job.kernel, job.arch, job.num_warps, job.signature, job.constexprs, job.options)
                jobs.setdefault(key, job)
    return list(jobs.values()), listed


def compile_job(job: CompileJob) -> KernelResources:
    """Compile one job (in this process) and measure it. Never raises for a compile error."""
    import triton
    from triton.compiler import ASTSource

    warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
    target = gpu_target(job.arch)
    info = ARCH_TABLE.get(job.arch)
    result = KernelResources(
        module=job.module, kernel=job.kernel, arch=job.arch, num_warps=job.num_warps,
        threads=job.num_warps * target.warp_size, constexprs=job.constexprs, signature=job.signature, options=job.options,
        shared_limit_bytes=info.shared_bytes if info else 0, known_issue=job.known_issue,
    )
    started = time.perf_counter()
    try:
        kernel, signature, constexprs, num_warps, attrs, options = _spec_parts(_specs(job.module, job.arch)[job.spec_index])
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs or None)
        from spec_hal.kernels.launch import FP_FUSION

        compiled = triton.compile(source, target=target,
                                  options={"num_warps": num_warps, "enable_fp_fusion": FP_FUSION, **options})
        result.shared_bytes = int(compiled.metadata.shared)
        if target.backend == "cuda":
            usage = cubin_resources(compiled.asm["cubin"])
            result.registers, result.local_bytes = usage["registers"], usage["local_bytes"]
        else:
            usage = amdgcn_resources(compiled.asm["amdgcn"])
            result.registers, result.agprs, result.sgprs = usage["registers"], usage["agprs"], usage["sgprs"]
            result.spills = usage["vgpr_spills"] + usage["sgpr_spills"]
            result.local_bytes = usage["local_bytes"]
            result.shared_bytes = max(result.shared_bytes, usage["lds_bytes"])
    except Exception as exc:  # a compile error is a result to report, not a crash of the matrix
        result.error = f"{type(exc).__name__}: {str(exc)[-1500:]}"
    result.compile_s = round(time.perf_counter() - started, 3)
    if result.error is None:
        result.problems = check_limits(result)
    return result


def _worker(tasks, results) -> None:
    """Compile jobs from ``tasks`` until a None arrives; announce each start so the parent can time it."""
    os.environ.pop("TRITON_INTERPRET", None)
    while (item := tasks.get()) is not None:
        index, job = item
        results.put(("started", index, os.getpid()))
        results.put(("done", index, compile_job(job)))


def _not_compiled(job: CompileJob) -> KernelResources:
    info = ARCH_TABLE.get(job.arch)
    return KernelResources(module=job.module, kernel=job.kernel, arch=job.arch, num_warps=job.num_warps,
                           threads=job.num_warps * (64 if job.arch.startswith("gfx") else 32), constexprs=job.constexprs,
                           signature=job.signature, options=job.options, shared_limit_bytes=info.shared_bytes if info else 0,
                           known_issue=job.known_issue)


def _timed_out(job: CompileJob, timeout_s: float) -> KernelResources:
    result = _not_compiled(job)
    result.compile_s = timeout_s
    result.error = f"compile took longer than {timeout_s:g} s (first-launch latency in an engine; stopped)"
    return result


def compile_all(compile_jobs: list[CompileJob], *, workers: int, timeout_s: float, progress=None) -> list[KernelResources]:
    """Compile in ``workers`` fresh processes; a compile running past ``timeout_s`` is killed and failed.

    Triton compiles in C++ for most of the time, where no Python-level timeout can interrupt it, so
    a stuck worker process is killed and replaced.
    """
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no inherited Triton state
    tasks, results = context.Queue(), context.Queue()
    for item in enumerate(compile_jobs):
        tasks.put(item)
    processes = []

    def start_worker():
        process = context.Process(target=_worker, args=(tasks, results), daemon=True)
        process.start()
        processes.append(process)
        return process

    running: dict[int, tuple[float, int]] = {}  # job index -> (start time, worker pid)
    done: dict[int, KernelResources] = {}
    live = [start_worker() for _ in range(workers)]
    try:
        while len(done) < len(compile_jobs):
            now = time.perf_counter()
            wait_s = min([1.0] + [max(since + timeout_s - now, 0.0) for since, _pid in running.values()])
            try:
                kind, index, payload = results.get(timeout=max(wait_s, 0.001))
            except queue.Empty:  # a deadline passed, or nothing happened for a second
                kind = None
            if kind == "started":
                running[index] = (time.perf_counter(), payload)
            elif kind == "done":
                running.pop(index, None)
                done[index] = payload
                if progress:
                    progress(len(done), len(compile_jobs), payload)
            for index, (since, pid) in list(running.items()):
                if time.perf_counter() - since > timeout_s:
                    running.pop(index)
                    done[index] = _timed_out(compile_jobs[index], timeout_s)
                    if progress:
                        progress(len(done), len(compile_jobs), done[index])
                    stuck = next(process for process in live if process.pid == pid)
                    stuck.kill()
                    stuck.join()
                    live.remove(stuck)
                    live.append(start_worker())
    finally:
        for _ in live:
            tasks.put(None)
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
    return [done[index] for index in range(len(compile_jobs))]


def _print_progress(finished: int, total: int, result: KernelResources) -> None:
    status = result.outcome
    print(f"[{finished}/{total}] {result.arch:<7} {result.kernel} num_warps={result.num_warps} "
          f"{result.constexprs} {result.compile_s:.1f}s {status}", file=sys.stderr, flush=True)


def _full_targets_only(jobs: list[CompileJob], results: list[KernelResources], smoke_archs: Sequence[str]):
    """(jobs, results) of the targets compiled in full: a smoke target's one configuration per
    kernel says nothing about whether an entry for some other configuration went stale."""
    kept = [(job, result) for job, result in zip(jobs, results) if job.arch not in smoke_archs]
    return [job for job, _ in kept], [result for _, result in kept]


def _labelled(job: CompileJob, issue: Optional[dict]) -> CompileJob:
    return replace(job, known_issue=f"{issue['action']}: {issue['reason']} ({issue['link']})") if issue else job


def run_matrix(archs: Sequence[str], *, module_names: Optional[Sequence[str]] = None, jobs: int = 0,
               timeout_s: float = DEFAULT_TIMEOUT_S, known_issues: Sequence[dict] = (), progress=None,
               smoke_archs: Sequence[str] = ()) -> dict:
    """Compile every kernel for ``archs``; returns the report (see :func:`write_json`).

    ``smoke_archs`` (a subset of ``archs``) compile one launch configuration per kernel
    (:func:`collect_jobs`); the manifest's stale check looks at the other targets only, where every
    configuration is compiled."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("the compile matrix must run without TRITON_INTERPRET=1 (the interpreter compiles nothing)")
    for arch in archs:
        gpu_target(arch)  # usage errors before any work
    if not set(smoke_archs) <= set(archs):
        raise ValueError(f"smoke targets {sorted(set(smoke_archs) - set(archs))} are not among the targets {list(archs)}")
    if module_names is None:
        from spec_hal.kernels import KERNEL_MODULES

        module_names = KERNEL_MODULES
    started = time.perf_counter()
    compile_jobs, listed = collect_jobs(module_names, archs, smoke_archs)
    import triton

    known_issues = active_known_issues(known_issues, triton.__version__)
    # Labelled before compiling, so that each progress line already says xfail where the manifest expects it.
    compile_jobs = [_labelled(job, known_issue_for(known_issues, job)) for job in compile_jobs]
    to_compile = [job for job in compile_jobs if not job.skipped]
    workers = jobs or min(os.cpu_count() or 1, len(to_compile)) or 1
    compiled = iter(compile_all(to_compile, workers=workers, timeout_s=timeout_s, progress=progress))
    results = [_not_compiled(job) if job.skipped else next(compiled) for job in compile_jobs]

    return {
        "triton_version": triton.__version__,
        "targets": list(archs),
        "smoke_targets": [arch for arch in archs if arch in smoke_archs],
        "modules": list(module_names),
        "listed_specs": listed,
        "distinct_compiles": len(compile_jobs),
        "workers": workers,
        "timeout_s": timeout_s,
        "wall_s": round(time.perf_counter() - started, 2),
        "counts": {outcome: sum(r.outcome == outcome for r in results) for outcome in ("pass", "fail", "xfail", "xpass", "skipped")},
        "failed": sum(r.outcome == "fail" for r in results),
        "stale_known_issues": stale_entries(list(known_issues), *_full_targets_only(compile_jobs, results, smoke_archs)),
        "kernels": [dict(asdict(r), ok=r.ok, outcome=r.outcome) for r in results],
    }


# --- output -----------------------------------------------------------------------------------------


def write_json(report: dict, path: str) -> None:
    with open(path, "w") as handle:
        json.dump(report, handle, indent=1)
        handle.write("\n")


def _range(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def markdown(report: dict) -> str:
    """One row per (kernel, target): ranges over its launch configs, and the worst status."""
    lines = [
        f"# Compile matrix (Triton {report['triton_version']})",
        "",
        f"{report['distinct_compiles']} distinct compiles ({report['listed_specs']} listed launch configs) for "
        f"{', '.join(report['targets'])} in {report['wall_s']} s with {report['workers']} worker(s): "
        + ", ".join(f"{count} {outcome}" for outcome, count in report["counts"].items() if count) + ".",
        *([f"Smoke targets (one launch configuration per kernel, a build check; every configuration on the others): "
           f"{', '.join(report['smoke_targets'])}."] if report.get("smoke_targets") else []),
        "",
        "Registers: NVIDIA registers per thread; AMD VGPRs per lane (including AGPRs) / SGPRs. "
        "Local: NVIDIA local-memory frame, AMD scratch, bytes per thread. Shared: shared memory / LDS per program.",
        "",
        "| kernel | target | configs | threads | registers | spills | local B | shared B (limit) | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list] = {}
    for kernel in report["kernels"]:
        groups.setdefault((kernel["module"].rsplit(".", 1)[-1] + "." + kernel["kernel"], kernel["arch"]), []).append(kernel)
    order = {arch: i for i, arch in enumerate(report["targets"])}
    for (name, arch), kernels in sorted(groups.items(), key=lambda item: (item[0][0], order.get(item[0][1], 99))):
        registers = _range(k["registers"] for k in kernels)
        if arch.startswith("gfx"):
            registers += " / " + _range(k["sgprs"] for k in kernels)
        status = _group_status(kernels)
        lines.append(
            f"| {name} | {arch} | {len(kernels)} | {_range(k['threads'] for k in kernels)} | {registers} | "
            f"{_range(k['spills'] for k in kernels) if arch.startswith('gfx') else 'n/r'} | "
            f"{_range(k['local_bytes'] for k in kernels)} | {_range(k['shared_bytes'] for k in kernels)} "
            f"({kernels[0]['shared_limit_bytes']}) | {status} |"
        )
    lines += ["", "n/r: ptxas does not record spill counts in the cubin; NVIDIA spills show up as local bytes.",
              "Ranges cover the compiled configs only; skipped configs (known issues) were not compiled."]
    notes = sorted({k["known_issue"] for k in report["kernels"] if k["known_issue"]})
    if notes:
        lines += ["", "Known issues (ci/xfail/compile-matrix.toml):", ""] + [f"- {note}" for note in notes]
    if report["stale_known_issues"]:
        lines += ["", "Stale known issues:", ""] + [f"- {line}" for line in report["stale_known_issues"]]
    return "\n".join(lines) + "\n"


def _group_status(kernels: list[dict]) -> str:
    """The worst outcome of a kernel's configs on one target, with counts of the rest."""
    counts = {}
    for kernel in kernels:
        counts[kernel["outcome"]] = counts.get(kernel["outcome"], 0) + 1
    failures = [k for k in kernels if k["outcome"] == "fail"]
    if failures:
        first = failures[0]
        return f"FAIL ({len(failures)}): " + (first["error"] or ", ".join(first["problems"])).splitlines()[0][:120]
    return ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items()))


def failure_line(kernel: dict, width: int = 160) -> str:
    """One line for a failed compile; the signature and the full error are in the JSON report."""
    reason = (kernel["error"] or "; ".join(kernel["problems"])).strip().splitlines()
    reason = reason[-1] if reason else "failed"
    line = f"FAIL {kernel['arch']} {kernel['kernel']} num_warps={kernel['num_warps']} {kernel['constexprs']}: {reason}"
    return line if len(line) <= width else line[:width - 3] + "..."


def main(targets: Sequence[str], *, json_path: Optional[str], markdown_path: Optional[str], jobs: int,
         modules: Optional[Sequence[str]] = None, timeout_s: float = DEFAULT_TIMEOUT_S,
         known_issues_path: Optional[str] = None, smoke_targets: Sequence[str] = ()) -> int:
    """The ``spec-hal compile-matrix`` command; returns the exit status."""
    os.environ.pop("TRITON_INTERPRET", None)  # before the kernels are imported: they must compile
    from spec_hal import kernels

    if kernels.loaded_mode() == "interpreter":
        print("spec-hal compile-matrix: the kernels were loaded by the interpreter in this process; run it in a fresh one",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        known_issues = load_known_issues(known_issues_path) if known_issues_path else []
        report = run_matrix(list(targets), module_names=modules, jobs=jobs, timeout_s=timeout_s,
                            known_issues=known_issues, progress=_print_progress, smoke_archs=list(smoke_targets))
    except (ValueError, OSError) as exc:
        print(f"spec-hal compile-matrix: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if json_path:
        write_json(report, json_path)
    text = markdown(report)
    if markdown_path:
        with open(markdown_path, "w") as handle:
            handle.write(text)
    print(text)
    for kernel in report["kernels"]:
        if kernel["outcome"] == "fail":
            print(failure_line(kernel))
    if report["failed"]:
        print("(every failure in full: --json FILE)" if not json_path else f"(every failure in full: {json_path})")
    for line in report["stale_known_issues"]:
        print(f"STALE {line}")
    counts = ", ".join(f"{count} {outcome}" for outcome, count in report["counts"].items() if count)
    print(f"compile matrix: {report['distinct_compiles']} compiles ({counts}) in {report['wall_s']} s "
          f"with {report['workers']} worker(s)")
    if report["failed"]:
        return EXIT_FAILED
    return EXIT_STALE if report["stale_known_issues"] else EXIT_OK
