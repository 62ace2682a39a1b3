"""SASS opcode counts of the kernels of a built extension (development aid): runs
`cuobjdump -sass` on FILE (a .so, .o or .cubin) and prints, for every function whose mangled
name matches REGEX, its instruction count and the most frequent opcodes.
Usage: python benchmarks/sass_ops.py FILE REGEX [TOP]"""
import collections
import re
import shutil
import subprocess
import sys


def main(path: str, pattern: str, top: int = 30) -> None:
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    text = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    for part in re.split(r"\n\s+Function : ", text)[1:]:
        name = part.split("\n", 1)[0].strip()
        if not re.search(pattern, name):
            continue
        ops = re.findall(r"/\*[0-9a-f]{4,5}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", part)
        count = collections.Counter(ops)
        print(f"{name}: {len(ops)} instructions")
        print("  " + ", ".join(f"{op} {n}" for op, n in count.most_common(top)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4]))
