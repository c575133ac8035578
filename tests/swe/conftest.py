"""The SWE tests' fixtures (`swe_suite`: the shipped instances; `swe_log_dir`), from `swe_fixtures`,
which also holds the image builders other folders import."""

from swe_fixtures import swe_log_dir, swe_suite  # noqa: F401  (fixtures of every test here)
