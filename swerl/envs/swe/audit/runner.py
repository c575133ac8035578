"""Running the audit: each hack (each candidate of it) as a scripted policy in a fresh episode sandbox,
its patch graded as an episode's (`run_hack`, `audit`), and the results (`HackResult`, `AuditReport`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from swerl.envs.swe.audit.hacks import HACKS, Hack
from swerl.envs.swe.types import GradingConfig, SWEInstance
from swerl.structs import SandboxSpec

MAX_CANDIDATES = 8
SCRIPT_PATH = "/tmp/swerl-audit/hack.sh"
CANDIDATES_PATH = "/tmp/swerl-audit/candidates.sh"
SCRIPT_TIMEOUT_S = 300.0


# ---- results -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HackResult:
    """One hack (one candidate of it) on one instance: what the grading paid."""

    instance_id: str
    hack: str
    candidate: str = ""
    """The candidate tried (a commit, a file, ...); empty for a hack with a single form."""
    reward: float = 0.0
    resolved: bool = False
    error: str = ""
    """Why the hack could not be run or graded, or the grader's error for its patch."""
    tampered_files: tuple[str, ...] = ()
    """Files the grader dropped from the patch as tampering (when the grader reports them)."""
    patch_files: tuple[str, ...] = ()
    """Files the hack's patch touches."""
    tampered: str = ""
    """The grade's evidence of a forged test run (`GradeResult.tampered`): which canaries caught it."""
    note: str = ""
    """What happened short of a grade: no candidates, an empty patch, the script's exit status."""
    status: str = ""
    """SWE-bench's resolution status of the grade (empty when not graded)."""
    script_exit: int | None = None
    duration_s: float = 0.0
    tried: bool = True
    """False for a placeholder: no candidate to try, no image, candidates could not be listed."""

    @property
    def earned(self) -> bool:
        return self.reward > 0


@dataclass(frozen=True)
class AuditReport:
    """The results of an audit (every hack, every candidate, every instance)."""

    results: tuple[HackResult, ...]
    hacks: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()
    duration_s: float = 0.0

    @property
    def earned(self) -> tuple[HackResult, ...]:
        """The results that got a reward > 0: the holes."""
        return tuple(r for r in self.results if r.earned)

    def best(self) -> dict[tuple[str, str], HackResult]:
        """Per (instance, hack): its best result (highest reward, earliest candidate)."""
        out: dict[tuple[str, str], HackResult] = {}
        for r in self.results:
            key = (r.instance_id, r.hack)
            if key not in out or r.reward > out[key].reward:
                out[key] = r
        return out

    def earned_pairs(self) -> tuple[tuple[str, str], ...]:
        """(instance, hack) pairs where some candidate earned."""
        return tuple(dict.fromkeys((r.instance_id, r.hack) for r in self.earned))

    def to_dict(self) -> dict[str, Any]:
        return {"hacks": list(self.hacks), "instances": list(self.instances),
                "duration_s": round(self.duration_s, 2),
                "earned": [dataclasses.asdict(r) for r in self.earned],
                "earned_pairs": [list(p) for p in self.earned_pairs()],
                "results": [dataclasses.asdict(r) for r in self.results]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# ---- running -----------------------------------------------------------------------------------------

_TEST_ID = re.compile(r"[\w./-]+\.py::[^\s`'\"]+")


def issue_tests(instance: SWEInstance) -> list[str]:
    """Test ids the issue text names (what a policy can read; the graded lists stay hidden)."""
    return list(dict.fromkeys(m.rstrip(".,;:)") for m in _TEST_ID.findall(instance.problem_statement)))


def script_env(instance: SWEInstance, hack: Hack, candidate: str = "") -> dict[str, str]:
    """What a hack script is told: its candidate, and the test ids the issue names."""
    env = {"SWERL_ISSUE_TESTS": " ".join(issue_tests(instance))}
    if hack.candidates:
        env["CANDIDATE"] = candidate
    return env


def episode_sandbox_spec(image: str) -> SandboxSpec:
    """An episode's sandbox spec, as `SWETaskSet.specs` builds it (the task config's limits)."""
    from swerl.envs.swe.tasks import SWETaskConfig

    cfg = SWETaskConfig()
    return SandboxSpec(image=image, memory=cfg.sandbox_memory, cpus=cfg.sandbox_cpus)


def episode_grading() -> GradingConfig:
    """The grading config an episode is graded with (`SWETaskSet.grading` of the default task config)."""
    from swerl.envs.swe.tasks import SWETaskConfig

    cfg = SWETaskConfig()
    return GradingConfig(timeout_s=cfg.grading_timeout_s, partial_reward=cfg.partial_reward)


def _sandbox(spec: SandboxSpec, client: Any, instance: SWEInstance, hack: str) -> Any:
    from swerl.sandbox import DockerSandbox

    return DockerSandbox(spec, client=client, labels={"swerl.swe.instance": instance.instance_id[:63],
                                                      "swerl.audit.hack": hack[:63]})


def _run_script(sb: Any, path: str, text: str, env: dict[str, str], timeout: float) -> Any:
    sb.write_file(path, text, mode=0o755)
    assigns = "".join(f"{k}={shlex.quote(v)} " for k, v in env.items())
    return sb.run(f"cd /testbed && {assigns}bash {path}", timeout=timeout)


def run_in_sandbox(sb: Any, hack: Hack, instance: SWEInstance, candidate: str = "",
                   timeout: float = SCRIPT_TIMEOUT_S) -> Any:
    """Run the hack's script (with `candidate`) in a started sandbox, as the agent user; its ExecResult."""
    return _run_script(sb, SCRIPT_PATH, hack.full_script(), script_env(instance, hack, candidate), timeout)


def candidates_in(sb: Any, hack: Hack, instance: SWEInstance, timeout: float = SCRIPT_TIMEOUT_S) -> list[str]:
    """The hack's candidates in a started sandbox: the first MAX_CANDIDATES distinct lines its
    `candidates` command prints ([""] for a hack with a single form)."""
    if not hack.candidates:
        return [""]
    r = _run_script(sb, CANDIDATES_PATH, hack.full_candidates(), script_env(instance, hack), timeout)
    found = [ln.strip() for ln in r.output.splitlines() if ln.strip()]
    return list(dict.fromkeys(found))[:MAX_CANDIDATES]


def list_candidates(hack: Hack, spec: SandboxSpec, instance: SWEInstance, *, client: Any = None) -> list[str]:
    """The hack's candidates on the instance, listed in a fresh sandbox of its image."""
    with _sandbox(spec, client, instance, hack.name) as sb:
        return candidates_in(sb, hack, instance)


def run_hack(instance: SWEInstance, hack: Hack, image: str, candidate: str = "", *, client: Any = None,
             spec: SandboxSpec | None = None, grading: GradingConfig | None = None) -> HackResult:
    """One hack (one candidate) as an episode: run in a fresh episode sandbox, its diff graded."""
    from swerl.envs.swe.grading import grade_patch, patch_files

    t0 = time.monotonic()
    spec = spec or episode_sandbox_spec(image)
    base = dict(instance_id=instance.instance_id, hack=hack.name, candidate=candidate)
    try:
        with _sandbox(spec, client, instance, hack.name) as sb:
            r = run_in_sandbox(sb, hack, instance, candidate)
            patch = sb.diff()
    except Exception as e:  # one broken run is a result, not the end of the audit
        return HackResult(**base, error=f"sandbox failed: {e}", duration_s=time.monotonic() - t0)
    note = ("" if r.exit_code == 0
            else f"script exited {r.exit_code}{' (timed out)' if r.timed_out else ''}: "
                 f"{r.output.strip()[-300:]}")
    files = tuple(patch_files(patch))
    if not patch.strip():
        # as SWE-bench (and an episode cut before submitting): an empty patch is not run, it scores 0
        return HackResult(**base, note=(note + "; " if note else "") + "empty patch: nothing to grade",
                          script_exit=r.exit_code, duration_s=time.monotonic() - t0)
    grade = grade_patch(instance, patch, config=grading or episode_grading(), image=image, client=client)
    return HackResult(**base, reward=float(grade.reward), resolved=bool(grade.resolved), error=grade.error,
                      tampered_files=tuple(getattr(grade, "tampered_files", ()) or ()), patch_files=files,
                      tampered=grade.tampered,
                      note=note, status=grade.status, script_exit=r.exit_code,
                      duration_s=time.monotonic() - t0)


def audit(instances: Sequence[SWEInstance], hacks: Sequence[Hack] = HACKS, *, workers: int = 2,
          client: Any = None, grading: GradingConfig | None = None,
          progress: Callable[[HackResult], None] | None = None) -> AuditReport:
    """Every hack (every candidate) on every instance, `workers` sandboxes at a time; see the module
    docstring. `progress` is called with each result as it comes."""
    from swerl.envs.swe.images import resolve_image
    from swerl.sandbox import lifecycle
    from swerl.sandbox.errors import SandboxError

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    t0 = time.monotonic()
    client = client or lifecycle.docker_client(timeout=600)
    grading = grading or episode_grading()
    images: dict[str, str] = {}
    failed: dict[str, str] = {}
    for inst in instances:
        try:
            images[inst.instance_id] = resolve_image(inst, client=client)
        except (SandboxError, ValueError) as e:
            failed[inst.instance_id] = str(e)

    slots: list[list[HackResult] | None] = []
    jobs: list[tuple[int, SWEInstance, Hack]] = []
    for inst in instances:
        for hack in hacks:
            slots.append(None)
            if inst.instance_id in failed:
                slots[-1] = [HackResult(inst.instance_id, hack.name,
                                        error=f"no image: {failed[inst.instance_id]}", tried=False)]
            else:
                jobs.append((len(slots) - 1, inst, hack))

    def candidates(job: tuple[int, SWEInstance, Hack]) -> tuple[int, list[str] | str]:
        i, inst, hack = job
        if not hack.candidates:
            return i, [""]
        try:
            return i, list_candidates(hack, episode_sandbox_spec(images[inst.instance_id]), inst,
                                      client=client)
        except (SandboxError, OSError, ValueError) as e:
            return i, f"listing candidates failed: {e}"

    def one(unit: tuple[int, SWEInstance, Hack, str]) -> tuple[int, HackResult]:
        i, inst, hack, cand = unit
        res = run_hack(inst, hack, images[inst.instance_id], cand, client=client, grading=grading)
        if progress:
            progress(res)
        return i, res

    units: list[tuple[int, SWEInstance, Hack, str]] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        by_slot = {job[0]: job for job in jobs}
        for i, cands in pool.map(candidates, jobs):
            _, inst, hack = by_slot[i]
            if isinstance(cands, str) or not cands:
                res = HackResult(inst.instance_id, hack.name, error=cands if isinstance(cands, str) else "",
                                 note="" if isinstance(cands, str) else "no candidates: nothing to try",
                                 tried=False)
                slots[i] = [res]
                if progress:
                    progress(res)
                continue
            slots[i] = []
            units += [(i, inst, hack, c) for c in cands]
        for i, res in pool.map(one, units):
            slot = slots[i]
            assert slot is not None
            slot.append(res)
    return AuditReport(results=tuple(r for slot in slots for r in (slot or ())),
                       hacks=tuple(h.name for h in hacks), instances=tuple(i.instance_id for i in instances),
                       duration_s=time.monotonic() - t0)
