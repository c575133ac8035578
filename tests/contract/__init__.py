# A package, so these modules' basenames (test_sandbox, test_engine, conftest) do not collide with the
# flat tests/ modules of the same names under pytest's default import mode.
