"""Building gpuflow's own wheel is quiet: no deprecation from the build backend (the `license`
table gave setuptools' warning three times), and the licence is in the metadata as SPDX."""

import glob
import os
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_build_has_no_deprecation_warning(tmp_path):
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "tests", "bench"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path), str(src)],
                       capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "BuildBackendWarning" not in out and "deprecated" not in out.lower(), out[-3000:]
    (wheel,) = glob.glob(str(tmp_path / "gpuflow-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta
