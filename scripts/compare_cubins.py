#!/usr/bin/env python3
"""Whether a template change left compiled kernels' code as it was: the .text and .nv.info sections of every
kernel in two `flashtune compile-check --save-cubins` folders (before, after), kernels matched by name and traits
arguments (FooTraitsI...E in the mangled symbol), so that a template argument the change added to the symbol
(a defaulted `bool PAGED = false`) neither hides nor fakes a difference. Exit 1 if any section differs or is
missing after.

usage: scripts/compare_cubins.py BEFORE_DIR AFTER_DIR
"""
import os
import re
import struct
import sys


def sections(path):
    """ELF64 section name -> bytes (empty for NOBITS)."""
    b = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    names = hdrs[shstrndx][4]
    out = {}
    for name_off, typ, _, _, off, size, *_ in hdrs:
        name = b[names + name_off:b.index(b"\0", names + name_off)].decode()
        out[name] = b"" if typ == 8 else b[off:off + size]
    return out


def kernel_key(section):
    """(kernel name, traits arguments) of a .text.<symbol> / .nv.info.<symbol> section, or None."""
    m = re.search(r"_ZN9flashtune(\d+)", section)
    t = re.search(r"([A-Za-z0-9]+Traits)I((?:L[a-z]+\d+E)+)E", section)
    if not m or not t:
        return None
    start = m.end()
    return section[start:start + int(m.group(1))], t.group(1) + t.group(2)


def load(folder):
    res = {}
    for f in sorted(os.listdir(folder)):
        for name, data in sections(os.path.join(folder, f)).items():
            for kind in (".text.", ".nv.info."):
                if name.startswith(kind) and (k := kernel_key(name)):
                    res[(kind,) + k] = data
    return res


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    before, after = load(sys.argv[1]), load(sys.argv[2])
    same = differ = 0
    for k in sorted(before):
        if after.get(k) == before[k]:
            same += 1
        else:
            differ += 1
            print("missing after:" if k not in after else "differs:", *k)
    print(f"{same} sections identical, {differ} differ or missing ({len(before)} before, {len(after)} after)")
    sys.exit(1 if differ or not before else 0)


if __name__ == "__main__":
    main()
