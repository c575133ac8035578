"""Protocol test doubles for services that cannot run on the build machines (named as fakes)."""
