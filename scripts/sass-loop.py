#!/usr/bin/env python3
"""sass-loop.py [REGEX] < SASS — each kernel's main loop in a SASS listing, counted by kind.

    cuobjdump -sass -arch sm_90 build-cuda/cuda/conv.cu.o | python3 scripts/sass-loop.py 'forward_tiled.*float'

The listing is cuobjdump's (`Function : NAME`, branches to addresses) or nvdisasm's (`.text.NAME:`,
branches to labels); REGEX (Python's re.search) picks kernels by their demangled name. A kernel's
main loop is the shortest backward branch's body that holds at least half of the kernel's
multiply-adds in any loop (FFMA on the CUDA cores, HMMA on the tensor cores): the k loop of a GEMM
tile, not a loop around it. Per kernel, one line: the loop's instructions (from its first and last
address: each SASS instruction is 16 bytes), by kind — fma (FFMA, HMMA), int (integer adds,
multiply-adds, compares, selects, shifts, logic), ldg, lds (LDS, LDSM), sts, cvt (conversions,
MUFU), spill (LDL, STL: local memory), other — and the integer divisions in the loop and in the
whole kernel, counted by I2F.RP: the float reciprocal estimate that every 32-bit integer division
and remainder by a value unknown at compile time starts with (a 64-bit one is a CALL to a
subroutine: counted in calls).
"""
import collections
import re
import subprocess
import sys

INT_OPS = {"IMAD", "IADD3", "IADD", "ISETP", "LOP3", "SEL", "LEA", "SHF", "IABS", "PRMT", "IMNMX", "VIADD", "IMUL"}
CVT_OPS = {"I2F", "F2I", "F2F", "I2FP", "F2FP", "MUFU"}


def parse(lines):
    """{mangled name: (instructions [(address, text)], labels {label: address})}"""
    funcs, cur, pending = {}, None, []
    for line in lines:
        m = re.match(r"^\s*Function\s*:\s*(\S+)", line) or re.match(r"^\.text\.(\S+):", line)
        if m:
            cur, pending = m.group(1), []
            funcs[cur] = ([], {})
            continue
        if cur is None:
            continue
        m = re.match(r"^(\.L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            address = int(m.group(1), 16)
            for label in pending:
                funcs[cur][1][label] = address
            pending = []
            funcs[cur][0].append((address, m.group(2)))
    return funcs


def opcode(text):
    text = re.sub(r"^@!?U?P\w+\s+", "", text)  # the predicate
    return text.split()[0].split(".")[0] if text else ""


def kind(op):
    if op in ("FFMA", "HMMA"):
        return "fma"
    if op == "LDG":
        return "ldg"
    if op in ("LDS", "LDSM"):
        return "lds"
    if op == "STS":
        return "sts"
    if op in ("LDL", "STL"):
        return "spill"
    if op in INT_OPS:
        return "int"
    if op in CVT_OPS:
        return "cvt"
    return "other"


def is_division(text):
    return "I2F" in text and ".RP" in text


def branch_target(text, labels):
    m = re.search(r"BRA\s+`?\(?(\.L_x_\d+)\)?", text)
    if m:
        return labels.get(m.group(1))
    m = re.search(r"BRA\s+(?:\S+\s+)?`?\(?(0x[0-9a-f]+)\)?", text)
    return int(m.group(1), 16) if m else None


def main_loop(instructions, labels):
    loops = []
    for address, text in instructions:
        target = branch_target(text, labels) if opcode(text) == "BRA" else None
        if target is not None and target < address:
            body = [(a, t) for a, t in instructions if target <= a <= address]
            loops.append((sum(kind(opcode(t)) == "fma" for _, t in body), target, address, body))
    if not loops:
        return None
    most = max(fma for fma, *_ in loops)
    return min((loop for loop in loops if loop[0] >= 0.5 * most), key=lambda loop: loop[2] - loop[1])


def main():
    pattern = re.compile(sys.argv[1]) if len(sys.argv) > 1 else None
    funcs = parse(sys.stdin)
    names = list(funcs)
    demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    for name, pretty in zip(names, demangled):
        short = re.sub(r"kiln::|cuda::|detail::|\(anonymous namespace\)::", "", pretty).split("(")[0]
        if pattern and not pattern.search(short):
            continue
        instructions, labels = funcs[name]
        if not instructions:
            continue
        divisions = sum(is_division(t) for _, t in instructions)
        calls = sum(opcode(t) == "CALL" for _, t in instructions)
        loop = main_loop(instructions, labels)
        print(short)
        if loop is None:
            print(f"    no loop; kernel: {divisions} divisions, {calls} calls")
            continue
        _, first, last, body = loop
        count = collections.Counter(kind(opcode(t)) for _, t in body)
        kinds = " ".join(f"{k} {count[k]}" for k in ("fma", "int", "ldg", "lds", "sts", "cvt", "spill", "other"))
        print(f"    loop {(last - first) // 16 + 1} instructions: {kinds}; divisions: loop "
              f"{sum(is_division(t) for _, t in body)}, kernel {divisions}; calls {calls}")


if __name__ == "__main__":
    main()
