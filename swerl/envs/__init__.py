"""Environments: SWE tasks (swerl.envs.swe), text games later. Never imports torch."""
