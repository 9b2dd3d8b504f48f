"""The launcher process does not load Shoal's runtime (ps, train, wire, numpy): it would
slow every `shoal` command and blur the dependency direction cli -> launch -> cluster."""

import subprocess
import sys



def test_importing_the_cli_does_not_load_the_runtime():
    code = ("import sys, shoal.cli.main; "
            "print(sorted(m for m in sys.modules if m.startswith(('shoal.ps', 'shoal.train',"
            " 'shoal.wire')) or m == 'numpy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
