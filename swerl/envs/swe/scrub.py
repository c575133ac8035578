"""Scrubbed task images: nothing an agent can reach in its sandbox holds the instance's solution.

A reward-seeking policy reads whatever the sandbox offers. In a task image as built naively the answer
is often one command away: the parent commit (`git checkout HEAD~1 -- .`), a later commit on another
branch or tag (`git log --all`, the hole SWE-bench's own images have: their clones carry the upstream
history past base_commit), the reflog, a stash, dangling objects, or an installed copy / sdist / wheel of
the fixed release. `scrub_image` derives from any instance image (offline-built, SWE-bench's, a user's) a
layer in which:

- /testbed's HEAD is the instance's base_commit, or the commit SWE-bench's harness makes on top of it
  with what its setup changed (author setup@swebench.config; swerl's build makes the same), plus, for an
  instance with a `setup_patch`, one commit that applies it (the task's start state), clean, on the
  branch it was on; every other ref, tag, remote, stash, note, reflog entry and worktree is gone,
  objects borrowed through alternates are copied in, and everything unreachable is pruned. HEAD's
  ancestors stay (`git log`, `blame` keep working) unless the fixed content is among them, in which case
  the history is cut at HEAD (a shallow repository);
- the *fixed blobs* — each file the gold patch changes, as it is after the patch, hashed as git hashes it
  — are then checked: none may exist in the repository, as a file anywhere on the image's filesystem
  (an installed copy), inside an archive named for the project (sdist, wheel, egg), or in another git
  repository on the image; pip caches are removed;
- the agent runs as a non-root user that owns /testbed: an image without a non-root `swerl.user` label
  (SWE-bench's run as root) gets the user `swerl` and the label. A root command could read the command
  harness's stdin through /proc and forge its own result; grading still runs as root;
- files the image left untracked in /testbed are git-excluded (they are the environment's, so no diff
  takes them), and what images keep for the grader only (`GRADER_ONLY`) is readable by root alone.

The layer is built once per (image, instance) and cached by content hash (`swerl-scrubbed-<id>:<hash>`);
episodes and grading both run on it. An image that cannot be scrubbed (no git, no repository at /testbed,
HEAD not at base_commit, a read-only repository, the fix found where it cannot be removed) is an
`ImageUnavailable` naming the image and the reason, before any episode starts.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

import docker.errors

from swerl.envs.swe.diffs import patch_files
from swerl.envs.swe.image_build import ImageUnavailable, build_cached_image
from swerl.envs.swe.types import SWEInstance
from swerl.sandbox import lifecycle
from swerl.sandbox.images import LABEL_HASH

SCRUB_LABEL = "swerl.scrubbed"
GRADER_ONLY = ("/r2e_tests",)
"""Paths images keep for grading only (R2E-Gym copies its hidden tests to /r2e_tests): made root's
alone, so the agent, never root on a scrubbed image, cannot read them."""
AGENT_USER = "swerl"
"""The non-root user the scrub layer adds when an image's agent would otherwise run as root."""
SCRUB_SH = r"""#!/bin/bash
# Runs as root in a `docker build` step of the scrubbed layer (see swerl/envs/swe/scrub.py).
set -euo pipefail
S=/tmp/swerl-scrub
fail() { echo "SWERL_SCRUB_ERROR: $*"; exit 3; }
g() { git -c safe.directory='*' -c gc.autoDetach=false "$@"; }
cd /testbed 2>/dev/null || fail "there is no /testbed"
command -v git >/dev/null || fail "git is not installed in the image"
[ -d .git ] || fail "/testbed is not a git repository"
( : > .git/swerl-write-check && rm -f .git/swerl-write-check ) 2>/dev/null ||
    fail "/testbed/.git is not writable"
owner=$(stat -c %u:%g .git)
head=$(g rev-parse --verify -q HEAD) || fail "/testbed has no HEAD commit"
# a symbolic base_commit (`HEAD`: the image defines the start, as SWE-smith's do) resolves in the repository
base=$(g rev-parse --verify -q "$BASE_COMMIT^{commit}" || true)
if [ "$head" != "$base" ]; then
    # SWE-bench's harness (4.x) commits what its setup changed on top of base_commit (`git commit
    # --allow-empty -am SWE-bench` as setup@swebench.config), and so does swerl's build: such commits
    # may stand between base_commit and HEAD, nothing else
    setup_only=""
    if [ -n "$base" ] && g merge-base --is-ancestor "$base" "$head"; then
        others=$(g log --format=%ae "$base..$head" | grep -cvx 'setup@swebench.config' || true)
        [ "$others" = 0 ] && setup_only=1
    fi
    [ -n "$setup_only" ] || fail "HEAD is $head, not the instance's base_commit $BASE_COMMIT (nor a \
setup commit of SWE-bench's harness on top of it)"
fi
[ -z "$(g status --porcelain --untracked-files=no)" ] || fail "/testbed's working tree differs from HEAD"
branch=$(g symbolic-ref -q --short HEAD || true)
if [ -s "$S/setup.diff" ]; then  # the task's start state on top of base_commit (SWE-smith's bug commit)
    g apply --index "$S/setup.diff" 2>"$S/apply.err" \
        || fail "the setup patch does not apply to base_commit: $(head -c 300 "$S/apply.err")"
    GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z \
        g -c user.name=swerl -c user.email=swerl@localhost -c commit.gpgsign=false commit -q --no-verify \
        -m "swerl: the task's start state" || fail "committing the setup patch failed"
    head=$(g rev-parse HEAD)
fi

# the fixed blobs: the gold patch applied to HEAD's tree in a scratch index; git writes the post-image
# blobs as loose objects, which the pruning below removes again
GIT_INDEX_FILE=$S/index g read-tree HEAD
GIT_INDEX_FILE=$S/index g apply --cached "$S/fix.diff" 2>"$S/apply.err" \
    || fail "the gold patch does not apply to HEAD: $(head -c 300 "$S/apply.err")"
GIT_INDEX_FILE=$S/index g diff --cached --raw --no-abbrev --no-renames HEAD \
    | awk -F'\t' '{split($1, a, " "); if (a[4] !~ /^0+$/) print a[4] "\t" $2}' > "$S/fixed"
rm -f "$S/index"

expire_and_prune() {
    g reflog expire --expire=now --all
    g -c gc.reflogExpire=now -c gc.reflogExpireUnreachable=now -c gc.pruneExpire=now gc --prune=now --quiet
}
g stash clear 2>/dev/null || true
g worktree prune 2>/dev/null || true
for r in $(g remote); do g remote remove "$r"; done
g for-each-ref --format='%(refname)' | while read -r ref; do g update-ref -d "$ref"; done
if [ -n "$branch" ]; then
    g update-ref "refs/heads/$branch" "$head"
    g symbolic-ref HEAD "refs/heads/$branch"
else
    g update-ref --no-deref HEAD "$head"
fi
rm -rf .git/logs .git/refs/original .git/refs/stash .git/lost-found .git/info/grafts .git/rebase-merge \
    .git/rebase-apply .git/sequencer .git/worktrees
rm -f .git/FETCH_HEAD .git/ORIG_HEAD .git/MERGE_HEAD .git/CHERRY_PICK_HEAD .git/REVERT_HEAD .git/BISECT_LOG \
    .git/AUTO_MERGE .git/SQUASH_MSG
if [ -s .git/objects/info/alternates ]; then  # borrowed objects come in before the lender goes
    g repack -a -d -q
    rm -f .git/objects/info/alternates
fi
expire_and_prune
cut=""
while IFS=$'\t' read -r sha path; do
    if g cat-file -e "$sha" 2>/dev/null; then cut=$path; fi
done < "$S/fixed"
if [ -n "$cut" ]; then  # the fixed content is in HEAD's own history: keep HEAD, cut the history behind it
    echo "$head" > .git/shallow
    expire_and_prune
fi
while IFS=$'\t' read -r sha path; do
    if g cat-file -e "$sha" 2>/dev/null; then fail "the fixed $path ($sha) is still in the repository"; fi
done < "$S/fixed"
[ "$(g rev-parse HEAD)" = "$head" ] && g log -1 --format=%H >/dev/null || fail "scrubbing broke HEAD"
chown -R "$owner" .git

# files the image left untracked in /testbed (R2E-Gym's run_tests.sh, install.sh, .venv) are the
# environment's, not the agent's work: excluded, so no diff of the agent's tree takes them in
mkdir -p .git/info
g ls-files --others --exclude-standard --directory -z | while IFS= read -r -d '' f; do
    printf '/%s\n' "$f" >> .git/info/exclude
done
# what the image keeps for the grader only (R2E-Gym's hidden tests) is root's alone; grading runs as root
for d in $GRADER_ONLY; do
    if [ -e "$d" ]; then chown -R root:root "$d" && chmod -R go-rwx "$d"; fi
done

# an image whose agent would run as root gets a user of its own that owns /testbed: a root command can
# read the command harness's descriptors through /proc (and kill it), a non-root one cannot. Grading
# stays root, as in SWE-bench's harness, so git must accept a tree owned by someone else.
if [ -n "$AGENT_USER" ]; then
    if ! id -u "$AGENT_USER" >/dev/null 2>&1; then
        if command -v useradd >/dev/null; then
            useradd --create-home --user-group --shell /bin/bash "$AGENT_USER" ||
                fail "useradd $AGENT_USER failed"
        else  # no shadow tools (busybox-style images): the same entries by hand, at the first free id >= 1000
            uid=1000
            while cut -d: -f3 /etc/passwd /etc/group | grep -qx "$uid"; do uid=$((uid + 1)); done
            echo "$AGENT_USER:x:$uid:$uid::/home/$AGENT_USER:/bin/sh" >> /etc/passwd
            echo "$AGENT_USER:x:$uid:" >> /etc/group
            mkdir -p "/home/$AGENT_USER" && chown "$uid:$uid" "/home/$AGENT_USER"
        fi
    fi
    [ "$(id -u "$AGENT_USER")" != 0 ] || fail "the user $AGENT_USER has uid 0"
    chown -R "$AGENT_USER:$(id -g "$AGENT_USER")" /testbed
    git config --system --add safe.directory '*' || fail "cannot write git's system config"
fi

# nothing else on the filesystem holds the fixed files
rm -rf /root/.cache/pip /home/*/.cache/pip
py=$(command -v python3 || ls /opt/*/bin/python3 /opt/*/envs/*/bin/python3 2>/dev/null | head -1 || true)
[ -n "$py" ] || fail "no python3 in the image to search it for copies of the fixed files"
"$py" "$S/find_fixed.py" "$S/fixed" "$PROJECT" > "$S/found" || fail "$(head -c 600 "$S/found")"
echo "SWERL_SCRUB_OK head=$head history=${cut:+cut}${cut:-kept} fixed_files=$(wc -l < "$S/fixed")"
"""

FIND_PY = r'''"""Search the image for the fixed files: argv[1] lists "<git blob sha>\t<path>", argv[2] names
the project. Runs on the image's own python3, as old as 3.5 (Ubuntu xenial's): no f-strings, no 3.7
subprocess API."""
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import zipfile

fixed = dict(line.rstrip("\n").split("\t", 1) for line in open(sys.argv[1]) if line.strip())
names = {os.path.basename(p) for p in fixed.values()}
project = {re.sub(r"[-_.]+", "", w.lower()) for w in sys.argv[2].split(",") if w}
ARCHIVES = (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz", ".whl", ".zip", ".egg")
SKIP = {"/proc", "/sys", "/dev", "/testbed/.git", "/tmp/swerl-scrub"}


def blob(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def in_archive(path):
    found = []
    if path.endswith((".whl", ".zip", ".egg")):
        with zipfile.ZipFile(path) as z:
            for n in z.namelist():
                if os.path.basename(n) in names and blob(z.read(n)) in fixed:
                    found.append("%s:%s" % (path, n))
    else:
        with tarfile.open(path) as t:
            for m in t:
                if (m.isfile() and os.path.basename(m.name) in names
                        and blob(t.extractfile(m).read()) in fixed):
                    found.append("%s:%s" % (path, m.name))
    return found


hits = []
for d, dirs, files in os.walk("/"):
    dirs[:] = [x for x in dirs if os.path.join(d, x) not in SKIP and not os.path.islink(os.path.join(d, x))]
    if {"HEAD", "objects"} <= set(dirs) | set(files) and d != "/testbed/.git":  # another git repository
        for sha, p in fixed.items():
            if subprocess.run(["git", "--git-dir=" + d, "cat-file", "-e", sha], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0:
                hits.append("%s (git objects: %s)" % (d, p))
    for f in files:
        p = os.path.join(d, f)
        try:
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            if f in names:
                with open(p, "rb") as fh:
                    if blob(fh.read()) in fixed:
                        hits.append(p)
            elif f.endswith(ARCHIVES) and any(w in re.sub(r"[-_.]+", "", f.lower()) for w in project):
                hits += in_archive(p)
        except (OSError, tarfile.TarError, zipfile.BadZipFile, EOFError):
            continue
if hits:
    print("the fixed files are in the image outside the repository: " + ", ".join(hits[:8]))
    sys.exit(1)
'''

_DOCKERFILE = """FROM {image}
COPY swerl-scrub/ /tmp/swerl-scrub/
USER root
RUN BASE_COMMIT={base_commit} PROJECT={project} AGENT_USER={agent_user} GRADER_ONLY="{grader_only}" \
    bash /tmp/swerl-scrub/scrub.sh && rm -rf /tmp/swerl-scrub
USER {user}
LABEL {scrub_label}={digest} {hash_label}={digest}{agent_label}
"""

def project_names(instance: SWEInstance) -> str:
    """Comma-separated names the project's archives would carry: the repository's name and the
    top-level folders of the files the gold patch changes."""
    words = {instance.repo.rsplit("/", 1)[-1]} if instance.repo else set()
    words |= {f.split("/", 1)[0] for f in patch_files(instance.patch) if "/" in f}
    return ",".join(sorted(w for w in words if re.fullmatch(r"[A-Za-z0-9_.-]+", w)))


def scrubbed_tag(instance: SWEInstance, digest: str) -> str:
    safe = re.sub(r"[^a-z0-9_.-]", "-", instance.instance_id.lower())[:100]
    return f"swerl-scrubbed-{safe}:{digest[:16]}"


def scrub_image(instance: SWEInstance, image: str, *, client: Any = None, log: Any = None) -> str:
    """The scrubbed layer of `image` for `instance` (built, or found cached); see the module docstring.
    Raises ImageUnavailable when the image cannot be scrubbed."""
    client = client or lifecycle.docker_client(timeout=600)
    try:
        img = client.images.get(image)
    except docker.errors.ImageNotFound as e:
        raise ImageUnavailable(f"{instance.instance_id}: image {image} is not on this machine") from e
    if not instance.patch.strip():
        raise ImageUnavailable(f"{instance.instance_id}: no gold patch — the scrub needs it to know what the "
                               "fix looks like (add the instance's `patch`)")
    config = img.attrs.get("Config") or {}
    user = config.get("User") or "root"
    # SWE-bench's images carry no `swerl.user`, so their agents would run as root: give them one
    labelled = (config.get("Labels") or {}).get("swerl.user", "")
    agent_user = "" if labelled and labelled not in ("root", "0") else AGENT_USER
    agent_label = f" swerl.user={agent_user}" if agent_user else ""
    project = project_names(instance)
    files = {"scrub.sh": SCRUB_SH, "find_fixed.py": FIND_PY, "fix.diff": instance.patch,
             "setup.diff": instance.setup_patch}
    template = _DOCKERFILE.format(image=img.id, base_commit=instance.base_commit, project=project or "-",
                                  user=user, agent_user=agent_user or '""', agent_label=agent_label,
                                  grader_only=" ".join(GRADER_ONLY),
                                  scrub_label=SCRUB_LABEL, hash_label=LABEL_HASH, digest="")
    digest = hashlib.sha256("\0".join([img.id, instance.instance_id, template,
                                       *files.values()]).encode()).hexdigest()
    tag = scrubbed_tag(instance, digest)
    dockerfile = _DOCKERFILE.format(image=img.id, base_commit=instance.base_commit, project=project or "-",
                                    user=user, agent_user=agent_user or '""', agent_label=agent_label,
                                  grader_only=" ".join(GRADER_ONLY),
                                    scrub_label=SCRUB_LABEL, hash_label=LABEL_HASH, digest=digest)

    def failed(error: str, out: str) -> Exception:
        why = re.findall(r"SWERL_SCRUB_ERROR: (.*)", out)
        return ImageUnavailable(
            f"{instance.instance_id}: image {image} cannot be scrubbed: {why[-1].strip() if why else error} "
            "— an agent could read the solution there, so no episode runs on it; fix the image (or the "
            "instance's base_commit)")

    t0 = time.monotonic()
    out = build_cached_image(client, tag, digest, {"Dockerfile": dockerfile,
                                                   **{f"swerl-scrub/{k}": v for k, v in files.items()}},
                             failed=failed, label=SCRUB_LABEL)
    if log and out is not None:
        ok = re.findall(r"SWERL_SCRUB_OK (.*)", out)
        log(f"scrubbed {image} → {tag} in {time.monotonic() - t0:.1f} s ({ok[-1].strip() if ok else ''})")
    return tag
