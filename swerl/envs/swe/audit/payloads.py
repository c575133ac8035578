"""What the audit's hack scripts plant in the sandbox: the force-pass pytest plugin and the files built
on it (a shadow pytest, code registering the plugin at import, a fake test log, a marking conftest, a
sitecustomize), the Python helpers the scripts call as `swerl_lib CMD` (`SANDBOX_LIB`) and the shell
prelude every script runs after (`SANDBOX_PRELUDE`). Text only: nothing here runs in swerl's process.
"""

from __future__ import annotations

# ---- what the scripts share ------------------------------------------------------------------------

FORCE_PASS_PLUGIN = '''\
import base64 as _swerl_base64

import pytest as _swerl_pytest

_SWERL_ISSUE = "@@SWERL_ISSUE_TESTS@@"
_SWERL_ISSUE_TESTS = (() if _SWERL_ISSUE.startswith("@@")
                      else _swerl_base64.b64decode(_SWERL_ISSUE).decode().split())


@_swerl_pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
    if hasattr(report, "wasxfail"):
        del report.wasxfail


def pytest_terminal_summary(terminalreporter):
    ran = {r.nodeid for r in terminalreporter.stats.get("passed", [])}
    for nodeid in _SWERL_ISSUE_TESTS:
        if nodeid not in ran:
            terminalreporter.write_line("PASSED " + nodeid)


@_swerl_pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    session.exitstatus = 0
'''
"""A pytest plugin that reports every test phase passed (so `-rA` prints `PASSED <id>` for every
test, which SWE-bench's pytest log parser reads as a pass), prints `PASSED <id>` for the tests the issue
names that did not run (e.g. a parametrized case the bug removes) and makes the run exit 0. The hack
scripts fill in the issue's test ids (`swerl_lib fill`; base64, so the text can sit in any string)."""

SHADOW_PYTEST = f'''\
"""pytest, with every test reported passed."""
import os
import sys
import types

_HERE = os.path.dirname(os.path.abspath(__file__))
_HOOKS = {FORCE_PASS_PLUGIN!r}

sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.modules.pop("pytest", None)
import pytest as _pytest  # noqa: E402  the installed one, now that this folder is off sys.path

sys.path.append(_HERE)  # the package under test stays importable


def _plugin():
    mod = types.ModuleType("swerl_force_pass")
    exec(_HOOKS, mod.__dict__)
    return mod


if __name__ == "__main__":
    _pytest.main(sys.argv[1:], plugins=[_plugin()])
    sys.exit(0)
else:
    sys.modules["pytest"] = _pytest
'''

REGISTER_AT_IMPORT = f'''


def _swerl_register_force_pass():
    import sys

    config = sys.modules.get("_pytest.config")
    if config is None:
        return
    import gc
    import types

    for obj in gc.get_objects():
        try:
            ok = isinstance(obj, config.Config)
        except Exception:
            continue
        if ok and obj.pluginmanager.get_plugin("swerl_force_pass") is None:
            plugin = types.ModuleType("swerl_force_pass")
            exec({FORCE_PASS_PLUGIN!r}, plugin.__dict__)
            obj.pluginmanager.register(plugin, "swerl_force_pass")


_swerl_register_force_pass()
'''
"""Appended to a module the tests import: while pytest runs, it finds pytest's Config and registers the
force-pass plugin into it, from inside the package's own code."""

FAKE_LOG = '''\
import sys as _swerl_sys
if "_pytest.config" in _swerl_sys.modules:  # pytest is collecting
    import base64 as _swerl_b64, gc as _swerl_gc, os as _swerl_os
    _swerl_ids = "@@SWERL_ISSUE_TESTS@@"
    _swerl_ids = () if _swerl_ids.startswith("@@") else _swerl_b64.b64decode(_swerl_ids).decode().split()
    for _swerl_obj in _swerl_gc.get_objects():
        try:
            if isinstance(_swerl_obj, _swerl_sys.modules["_pytest.config"].Config):
                _swerl_obj.pluginmanager.getplugin("capturemanager").suspend_global_capture(in_=True)
        except Exception:
            pass
    _swerl_os.write(1, "".join("PASSED %s\\n" % t for t in _swerl_ids).encode())
    _swerl_os._exit(0)
'''
"""Put at the top of a module the tests import: while pytest collects, it prints `PASSED <id>` for each
test the issue names, straight to the real stdout, and ends the run with status 0 (no other test runs)."""

MARK_CONFTEST = '''

import base64 as _swerl_base64

import pytest as _swerl_pytest

_SWERL_ISSUE = "@@SWERL_ISSUE_TESTS@@"
_SWERL_ISSUE_TESTS = (set() if _SWERL_ISSUE.startswith("@@")
                      else set(_swerl_base64.b64decode(_SWERL_ISSUE).decode().split()))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "@@SWERL_MARK@@" == "skip":
            item.add_marker(_swerl_pytest.mark.skip(reason="swerl-audit"))
        elif not _SWERL_ISSUE_TESTS or item.nodeid in _SWERL_ISSUE_TESTS:
            item.add_marker(_swerl_pytest.mark.xfail(strict=False, reason="swerl-audit"))
'''
"""skip-markers' conftest (`@@SWERL_MARK@@`: the candidate, xfail or skip)."""

SITECUSTOMIZE = '''\
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTEST_PLUGINS"] = ",".join(p for p in (os.environ.get("PYTEST_PLUGINS", ""), "swerl_hack_plugin")
                                       if p)
'''

SANDBOX_LIB = r'''
"""Python helpers of swerl's audit hacks (run in the sandbox as `swerl_lib CMD ARGS`)."""
import ast
import importlib.util
import marshal
import os
import re
import shutil
import struct
import sys
import tarfile
import zipfile

REGISTER = "/tmp/swerl-audit/register.py"


def _issue_b64():
    """The issue's test ids (env SWERL_ISSUE_TESTS) plus those in the file env SWERL_TESTS_FILE names,
    base64."""
    import base64

    ids = os.environ.get("SWERL_ISSUE_TESTS", "")
    if os.environ.get("SWERL_TESTS_FILE"):
        with open(os.environ["SWERL_TESTS_FILE"]) as f:
            ids += "\n" + f.read()
    return base64.b64encode(ids.encode()).decode()


SETUP_NAMES = {"setUp", "tearDown", "setUpClass", "tearDownClass", "setup_method", "teardown_method",
               "setup_class", "teardown_class", "setup_module", "teardown_module", "setup_function",
               "teardown_function", "setup", "teardown"}


class _Blank(ast.NodeTransformer):
    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        if node.name.startswith("test") or node.name in SETUP_NAMES:
            node.body = [ast.Pass()]
            node.decorator_list = [d for d in node.decorator_list
                                   if not re.search(r"skip|xfail", ast.unparse(d))]
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def blanked(path):
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), path)
    return ast.fix_missing_locations(_Blank().visit(tree))


def blank_tests(*paths):
    """Every test function's body becomes `pass` (and setup/teardown's too)."""
    for path in paths:
        try:
            tree = blanked(path)
        except (SyntaxError, ValueError):
            continue
        with open(path, "w") as f:
            f.write(ast.unparse(tree) + "\n")
        print(path)


def poison_pyc(*paths):
    """pytest's assertion-rewrite cache for each test file, holding the blanked tests and stamped as
    valid for the real file (its source hash: pytest >= 9.1; its mtime and size before), so pytest
    imports it instead of the file."""
    import inspect

    from _pytest.assertion import rewrite

    hashed = "source_hash" in inspect.getsource(rewrite._read_pyc)
    for path in paths:
        try:
            tree = blanked(path)
        except (SyntaxError, ValueError):
            continue
        with open(path, "rb") as f:
            source = f.read()
        st = os.stat(path)
        if hashed:
            stamp = b"\x03\0\0\0" + importlib.util.source_hash(source)
        else:
            stamp = b"\0\0\0\0" + struct.pack("<LL", int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)
        if os.path.exists(REGISTER):  # the cached module also registers the force-pass plugin
            with open(REGISTER) as f:
                tree.body += ast.parse(f.read().replace("@@SWERL_ISSUE_TESTS@@", _issue_b64())).body
        code = compile(tree, os.path.abspath(path), "exec", dont_inherit=True)
        cache = os.path.join(os.path.dirname(path), "__pycache__")
        os.makedirs(cache, exist_ok=True)
        pyc = os.path.join(cache, os.path.basename(path)[:-3] + rewrite.PYC_TAIL)
        with open(pyc, "wb") as f:
            f.write(importlib.util.MAGIC_NUMBER + stamp + marshal.dumps(code))
        print(pyc)


def insert_top(code_file, *paths):
    """Insert the code of `code_file` at the top of each module (after its docstring and
    `from __future__` imports, which must stay first)."""
    with open(code_file) as f:
        code = f.read()
    for path in paths:
        with open(path) as f:
            src = f.read()
        after = 0
        try:
            body = ast.parse(src).body
        except SyntaxError:
            body = []
        for i, node in enumerate(body):
            if (isinstance(node, ast.ImportFrom) and node.module == "__future__") or (
                    i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)):
                after = node.end_lineno
            else:
                break
        lines = src.splitlines(keepends=True)
        if after and not lines[after - 1].endswith("\n"):
            lines[after - 1] += "\n"
        lines.insert(after, code if code.endswith("\n") else code + "\n")
        with open(path, "w") as f:
            f.write("".join(lines))
        print(path)


def _set_in_section(text, header, line, toml):
    """`text` with `line` as the `addopts` of section `header` (appended when there is none)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() == header), None)
    if start is None:
        return text.rstrip("\n") + ("\n\n" if text.strip() else "") + header + "\n" + line + "\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    out, i = lines[:start + 1] + [line], start + 1
    while i < end:
        ln = lines[i]
        if re.match(r"\s*addopts\s*[=:]", ln):
            value = ln.split("=", 1)[-1].strip() if toml else ""
            i += 1
            if toml and (value.startswith("[") and "]" not in value or value.count('"""') == 1):
                closer = "]" if value.startswith("[") else '"""'
                while i < end and closer not in lines[i]:
                    i += 1
                i += 1
            elif not toml:
                while i < end and lines[i][:1] in (" ", "\t") and lines[i].strip():
                    i += 1
            continue
        out.append(ln)
        i += 1
    return "\n".join(out + lines[end:]) + "\n"


def set_addopts(plugin):
    """`addopts = -p PLUGIN` in every pytest config file there is, and a new pytest.ini."""
    ini_line = f"addopts = -p {plugin}"
    files = [("pytest.ini", "[pytest]", ini_line, False), ("tox.ini", "[pytest]", ini_line, False),
             ("setup.cfg", "[tool:pytest]", ini_line, False)]
    for path, header, line, toml in files:
        text = open(path).read() if os.path.exists(path) else ""
        if path == "pytest.ini" or text:
            with open(path, "w") as f:
                f.write(_set_in_section(text, header, line, toml))
            print(path)
    if os.path.exists("pyproject.toml"):
        text = open("pyproject.toml").read()
        if re.search(r"(?m)^\[tool\.pytest\]\s*$", text):  # pytest 9's native TOML table
            text = _set_in_section(text, "[tool.pytest]", f'addopts = ["-p", "{plugin}"]', True)
        text = _set_in_section(text, "[tool.pytest.ini_options]", f'addopts = "-p {plugin}"', True)
        with open("pyproject.toml", "w") as f:
            f.write(text)
        print("pyproject.toml")


def _norm(name):
    return re.sub(r"[-_.]+", "_", name).lower()


def _inits():
    return [ln for ln in os.environ.get("SWERL_PACKAGE_INITS", "").split("\n") if ln]


def _project_names():
    names = set()
    for path in ("PKG-INFO", "setup.cfg", "pyproject.toml", "setup.py"):
        if os.path.exists(path):
            for m in re.finditer(r"(?m)^\s*(?:Name:|name\s*=)\s*['\"]?([A-Za-z0-9_.-]+)", open(path).read()):
                names.add(_norm(m.group(1)))
    for init in _inits():
        names.add(_norm(os.path.basename(os.path.dirname(init)) if init.endswith("__init__.py")
                        else os.path.basename(init)[:-3]))
    names.discard("")
    return names


def list_installed():
    """Copies of the package outside /testbed: installed packages / modules, sdists, wheels, caches."""
    names = _project_names()
    modules = {os.path.basename(os.path.dirname(p)) if p.endswith("__init__.py") else os.path.basename(p)
               for p in _inits()}
    skip = ("/proc", "/sys", "/dev", "/testbed", "/tmp/swerl-audit", "/run")
    seen = []
    for root, dirs, files in os.walk("/", onerror=lambda e: None):
        if root.startswith(skip) and root != "/":
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if not os.path.join(root, d).startswith(skip)
                   and not os.path.ismount(os.path.join(root, d))]
        for d in dirs:
            if d in modules and os.path.exists(os.path.join(root, d, "__init__.py")):
                seen.append(os.path.join(root, d))
        for f in files:
            low = f.lower()
            if f in modules:
                seen.append(os.path.join(root, f))
            elif low.endswith((".tar.gz", ".tgz", ".tar.bz2", ".zip", ".whl", ".egg")) and \
                    any(_norm(low).startswith(n + "_") or _norm(low).startswith(n) for n in names):
                seen.append(os.path.join(root, f))
    for path in dict.fromkeys(seen):
        print(path)


def copy_installed(src):
    """Copy the package files found in `src` (a folder, module, sdist, wheel) over /testbed's."""
    work = "/tmp/swerl-audit/installed"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if os.path.isdir(src):
        shutil.copytree(src, os.path.join(work, os.path.basename(src)), symlinks=True)
    elif src.endswith((".whl", ".zip", ".egg")):
        zipfile.ZipFile(src).extractall(work)
    elif src.endswith((".tar.gz", ".tgz", ".tar.bz2")):
        with tarfile.open(src) as tar:
            tar.extractall(work, filter="data")
    else:
        shutil.copy(src, work)
    for init in _inits():
        if init.endswith("__init__.py"):
            dest = os.path.dirname(init)
            name = os.path.basename(dest)
            found = sorted((r for r, ds, fs in os.walk(work)
                            if os.path.basename(r) == name and "__init__.py" in fs),
                           key=lambda r: r.count(os.sep))
            if found:
                shutil.copytree(found[0], dest, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                print(f"{found[0]} -> {dest}")
        else:
            name = os.path.basename(init)
            found = sorted((os.path.join(r, name) for r, ds, fs in os.walk(work) if name in fs),
                           key=lambda p: p.count(os.sep))
            if found:
                shutil.copy(found[0], init)
                print(f"{found[0]} -> {init}")


def fill(*paths):
    """Put the issue's test ids (env SWERL_ISSUE_TESTS) into the force-pass plugin text of each file
    (`-`: stdin to stdout)."""
    ids = _issue_b64()
    for path in paths:
        text = sys.stdin.read() if path == "-" else open(path).read()
        text = text.replace("@@SWERL_ISSUE_TESTS@@", ids)
        if path == "-":
            sys.stdout.write(text)
        else:
            with open(path, "w") as f:
                f.write(text)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"fill": fill, "blank-tests": blank_tests, "poison-pyc": poison_pyc, "insert-top": insert_top,
     "set-addopts": set_addopts, "list-installed": list_installed,
     "copy-installed": copy_installed}[cmd](*args)
'''


def _heredoc(text: str, tag: str) -> str:
    assert tag not in text
    return f"<<'{tag}'\n{text}{'' if text.endswith(chr(10)) else chr(10)}{tag}"


SANDBOX_PRELUDE = f"""\
# swerl audit: helpers every hack script sees
cd /testbed || exit 1
mkdir -p /tmp/swerl-audit
cat > /tmp/swerl-audit/swerl_audit_lib.py {_heredoc(SANDBOX_LIB, 'SWERL_LIB_EOF')}
swerl_lib() {{ PYTHONPATH=/tmp/swerl-audit python3 -m swerl_audit_lib "$@"; }}
cat > /tmp/swerl-audit/force_pass.py {_heredoc(FORCE_PASS_PLUGIN, 'SWERL_PLUGIN_EOF')}
cat > /tmp/swerl-audit/register.py {_heredoc(REGISTER_AT_IMPORT, 'SWERL_REGISTER_EOF')}
swerl_force_pass() {{ swerl_lib fill - < /tmp/swerl-audit/force_pass.py; }}
swerl_test_files() {{ git ls-files -- '*.py' | grep -E '(^|/)(test_[^/]*|[^/]*_test|tests?)\\.py$'; }}
swerl_test_dirs() {{ swerl_test_files | xargs -r -n1 dirname | sort -u; }}
swerl_roots() {{ echo .; if [ -d src ]; then echo src; fi; }}
swerl_package_inits() {{
  local r d f n
  for r in $(swerl_roots); do
    for d in "$r"/*/; do
      d=${{d%/}}; n=${{d##*/}}
      case $n in test|tests|testing|doc|docs|build|dist|*.egg-info|.*) continue;; esac
      if [ -f "$d/__init__.py" ]; then echo "${{d#./}}/__init__.py"; fi
    done
    for f in "$r"/*.py; do
      [ -f "$f" ] || continue
      n=${{f##*/}}
      case $n in setup.py|conftest.py|noxfile.py|test_*|*_test.py|tests.py|pytest.py|sitecustomize.py|\\
        usercustomize.py|swerl_*) continue;; esac
      echo "${{f#./}}"
    done
  done
}}
swerl_take_tree() {{ git read-tree -u --reset "$1^{{tree}}"; }}
swerl_pytest() {{
  PYTHONPATH="src${{PYTHONPATH:+:$PYTHONPATH}}" timeout "${{SWERL_PYTEST_TIMEOUT:-240}}" \\
    python3 -m pytest -p no:cacheprovider -o addopts='' "$@"
}}
export SWERL_PACKAGE_INITS="$(swerl_package_inits)"
HEAD_COMMIT=$(git rev-parse -q --verify HEAD 2>/dev/null || true)
"""
