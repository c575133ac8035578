"""What the cluster tests share with the driver they start in a process of their own: the second daemon's
address, a policy that sleeps in its sandbox, episode specs and the fleet's config."""

from __future__ import annotations

from swerl.agent import ToolEnv
from swerl.agent import tool_call_text as call
from swerl.agent.env import EpisodeSpec
from swerl.cluster import ClusterConfig, HostConfig, RayConfig
from swerl.structs import Generation, SandboxSpec

DAEMON2_NAME = "swerl-test-docker2"
DAEMON2 = f"unix:///run/{DAEMON2_NAME}.sock"
"""The second Docker daemon of the cluster tests (`conftest.daemon2`)."""


class SleepPolicy:
    """Each turn: a bash call that sleeps, then prints the container's hostname (the sandbox's id)."""

    def __init__(self, tok, sleep_s: float = 1.0) -> None:
        self.tok, self.sleep_s = tok, sleep_s

    async def generate(self, prompt_ids, params):
        text = call("bash", {"command": f"sleep {self.sleep_s}; cat /etc/hostname"})
        ids = [*self.tok.encode(text, add_special_tokens=False), self.tok.convert_tokens_to_ids("<|im_end|>")]
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")


def specs(n: int, image: str) -> list[EpisodeSpec]:
    return [EpisodeSpec(task_id=f"t{i}", group=i // 2, sample=i % 2, sandbox=SandboxSpec(image=image),
                        make_env=lambda sb: ToolEnv(sb, "print the hostname")) for i in range(n)]


def fleet_cfg(cluster, **kw) -> ClusterConfig:
    hosts = (HostConfig(name="a", capacity=2), HostConfig(name="b", docker_url=DAEMON2, capacity=2))
    return ClusterConfig(backend="ray", ray=RayConfig(address=cluster.address), hosts=kw.pop("hosts", hosts),
                         heartbeat_s=0.5, reap_interval_s=1.0, start_timeout_s=30, **kw)
