"""SWE-bench's three images (base, environment, instance) for Python repositories, built here from
SWE-bench's own specs, a local git mirror and packages downloaded on the host — no registry, no network
inside a build.

`swerl tasks build-images --tasks FILE --repos DIR` does what SWE-bench's image builder does, on a
machine where no container registry, conda channel or GitHub is reachable (only PyPI, from the host):

- **Specs.** What each layer holds comes from swebench 4.1.0's spec tables, as for grading
  (`swerl.envs.swe.specs`): `_spec_oracle.py build` makes SWE-bench's environment script with the
  requirements.txt / environment.yml it would fetch from GitHub read from the mirror at the row's
  environment_setup_commit instead, so the image names are SWE-bench's own:
  `sweb.base.py.x86_64:latest`, `sweb.env.py.x86_64.<hash of the env script>:latest`,
  `sweb.eval.x86_64.<instance id>:latest` (the `image` a published row is given), which
  `resolve_image` then finds locally and scrubs like any pulled image.
- **Mirrors.** `--repos DIR` holds one git repository per SWE-bench repository `owner/name`:
  `DIR/owner__name.git` (a bare mirror, `git clone --mirror`), `DIR/owner__name`, or `DIR/owner/name`
  (any clone). It must have the rows' base_commit and environment_setup_commit.
- **Packages.** Every package a layer installs is resolved by pip for the spec's Python against the
  as-of index (`swerl.envs.swe.pypi`): PyPI as it stood at `RESOLVED_AS_OF`, the day swebench 4.1.0
  was released, whatever day or machine the build runs on, with the user's pip configuration left out
  (`swerl.envs.swe.resolve`). The files are kept in the wheels folder (`--wheels`, default
  `.cache/swe/wheels`), a cache checked by sha256 — what else it holds is never offered to pip — and
  the index's pages in `.cache/swe/pypi`, so `--offline` resolves as online. Builds run with `--network
  none` and install with `pip --no-index` from exactly the resolved files; sdists are built in the image
  from their resolved build requirements. The resolved set is the layer's **lock**, recorded in its
  `swerl.lock` label (`FILE sha256` per line after a `# as-of ...` line) and part of its content hash:
  one instance or fifty, in any order, give the same env image; `build-images --check` resolves again
  with fresh pages and names what differs.
- **Base layer.** swerl's base image of the Debian or Ubuntu suite whose python3 is the spec's Python
  (`SUITE_PYTHONS`: Ubuntu xenial 3.5, bionic 3.6, focal 3.8, jammy 3.10; Debian bullseye 3.9, bookworm
  3.11, trixie 3.13; `swerl sandbox build-base --suite S`, built here by the same debootstrap route when
  missing — Ubuntu's need Ubuntu's archive keyring on the host), not SWE-bench's Ubuntu + Miniconda
  (which needs the network), plus swerl's `conda activate` shim at /opt/miniconda3/bin/activate
  (sandbox/conda_activate.sh). SWE-bench has one base image for every Python (conda brings the Python);
  here the Python comes with the suite, so each suite has its own: bookworm's is SWE-bench's
  `sweb.base.py.x86_64:latest`, another suite's has the suite after the name
  (`sweb.base.py.x86_64.bullseye:latest`). Every layer is labelled with the swerl base it stands on
  (`swerl.base-image`), and the env and instance images keep SWE-bench's names, so eval and training
  find them as they find pulled ones.
- **Environment layer.** A venv at /opt/miniconda3/envs/testbed, the path of SWE-bench's conda env,
  with the base image's python3 — the only Python there is: a spec asking for a version no suite ships
  (3.7, 3.12) is an error naming it and the versions that do build. The venv gets pip, setuptools and
  wheel first, as `conda create python=X` gives SWE-bench's env (`BUILD_TOOLS`). Then, in SWE-bench's
  order: the spec's conda packages (a `packages` list, or an environment.yml's dependencies) installed
  from PyPI under the same names (`name=1.2` meaning `name==1.2.*`); `requirements.txt` from the
  mirror; `pip_packages`. A conda dependency that is not a
  Python package (compilers, C libraries, tools) is an error naming it, as is one PyPI does not have.
- **Instance layer.** The repository at base_commit with its history up to there (a bundle of the
  mirror's base_commit, nothing after it) at /testbed, owned by the sandbox user, on branch `main`;
  then, in SWE-bench's order, the spec's `pre_install` and install steps (`pip install -e .` ...), run
  offline as root in the testbed env. What the install step downloads is resolved from a host checkout
  the pre_install steps have already edited (`checkout._apply_edits`: sphinx 3.x's pins Jinja2<3.0 in
  setup.py), so it is what the edited files ask for. The packages its `apt-get install` steps name are
  downloaded first, with recommended ones as that command installs them, by the env image's own apt in a
  throwaway container on the bridge network (`_fetch_debs`: the suite's archive is reached from this
  machine, never from a build; an Ubuntu suite's with every component listed, as Ubuntu's official
  image lists them; cached in .cache/swe/debs), and installed from those files; `apt-get
  update` / `upgrade` are left out; steps that fetch from the network (wget, curl, git clone) are
  errors; the others (sed on setup.py, locale-gen, ...) run as written. Tracked files the steps
  changed are committed on top of base_commit as SWE-bench's harness commits them (its `SWE-bench`
  setup commit, which the scrub accepts), and reported; without such changes HEAD stays base_commit.
  The untracked files the install made (egg-info, build/) go into .git/info/exclude so the agent's
  diff does not show them.

SWE-bench's eval script reinstalls the repository (`pip install -e .`) before the tests; in a grading
container (no network, the sandbox user) that step fails at once and the tests run on the install made
at build time, as they do for pulled images graded here: a patch that changes the packaging metadata
(new dependencies, entry points) is not reinstalled.

One module per job: `plan` (rows → build plans; the labels, caches and in-image paths), `conda` (conda →
pip), `mirrors` (the git mirrors), `checkout` (base_commit out of the mirror), `templates` (Dockerfiles and
scripts), `apt` (the suite's .debs), `layers` (the three Docker layers), `locks` (what a built layer
records), `pipeline` (the whole run).

Every layer is cached by a content hash (`swerl.content-hash`): an unchanged one costs one lookup. An
image of the instance's name that swerl did not build (a pulled SWE-bench image) is kept unless
`force`.
"""
from swerl.envs.swe.build.conda import NON_PYTHON_CONDA, conda_to_pip
from swerl.envs.swe.build.locks import image_lock
from swerl.envs.swe.build.mirrors import find_mirror, mirror_candidates
from swerl.envs.swe.build.pipeline import build_images
from swerl.envs.swe.build.plan import (
    BASE_IMAGE_LABEL,
    BUILD_TOOLS,
    DEBS_CACHE,
    ENV_DIR,
    LAYER_LABEL,
    LOCK_LABEL,
    PAGES_CACHE,
    PYTHON_SUITES,
    WHEELS_CACHE,
    BuildPlan,
    BuildResult,
    buildable_pythons,
    plan_builds,
    suite_base_image,
)
from swerl.envs.swe.resolve import (
    BuildError,
    cpython_abi,
    glibc_version,
    host_python,
    manylinux_platforms,
    marker_environment,
)

__all__ = [
    "BASE_IMAGE_LABEL",
    "BUILD_TOOLS",
    "DEBS_CACHE",
    "ENV_DIR",
    "LAYER_LABEL",
    "LOCK_LABEL",
    "NON_PYTHON_CONDA",
    "PAGES_CACHE",
    "PYTHON_SUITES",
    "WHEELS_CACHE",
    "BuildError",
    "BuildPlan",
    "BuildResult",
    "build_images",
    "buildable_pythons",
    "conda_to_pip",
    "cpython_abi",
    "find_mirror",
    "glibc_version",
    "host_python",
    "image_lock",
    "manylinux_platforms",
    "marker_environment",
    "mirror_candidates",
    "plan_builds",
    "suite_base_image",
]
