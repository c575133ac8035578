"""Evaluation (`swerl eval`, and the training loop's `eval_every`).

- `predictions`: grade a SWE-bench predictions file (`swerl eval predictions FILE`).
- `episodes`: a model on any env kind's tasks through the rollout runner, SWE and the text games alike
  (`swerl eval model`, `swerl eval game KIND`, training's validation); SWE grading happens in the SWE env's
  finish hook only. The toy game is played on the engine's tokens.
- `model`: the engine and tokenizer of the model under evaluation.
- `report`: the sample records, resume, and the reports (SWE-bench's run report, pass@k, per-group success,
  the `val/` metrics).
"""
