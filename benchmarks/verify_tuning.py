"""dsagen.verify's CUDA sweep of a spec under kernel tunings (development aid: `dsagen verify`
checks the default tuning only). Prints each tuning's report table and verdict; exit status 1
if any failed.
Usage: python benchmarks/verify_tuning.py SPEC 'json-tuning' ['json-tuning' ...]"""
import json
import sys
import time

import dsagen
from dsagen.verify import verify


def main(path, tunings):
    spec = dsagen.load_spec(path)
    ok = True
    for t in tunings:
        t0 = time.time()
        ops = dsagen.load(spec, tuning=json.loads(t))
        rep = verify(spec, ops, "cuda")
        print(f"== {spec.name} {t}\n{rep.table()}\n{spec.name} {t}: {'PASSED' if rep.passed else 'FAILED'} "
              f"({len(rep.rows)} cases, {time.time() - t0:.1f} s)", flush=True)
        ok &= rep.passed
    return ok


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(0 if main(sys.argv[1], sys.argv[2:]) else 1)
