"""The token preprocess's SASS in this tree, offsets stripped, for comparing two trees (seventeenth session: the fp16
fix's bf16 build equals main's at d=64 and 128; docs/kernel-notes.md). Offline, Triton 3.6.0, sm_90:

    PYTHONPATH=<triton 3.6 site>:. python docs/measurements/preprocess-sass-compare-1128g.py /tmp/new
    (cd <other tree> && PYTHONPATH=<triton 3.6 site>:. python <this file> /tmp/old)
    diff /tmp/old-64.sass /tmp/new-64.sass; diff /tmp/old-128.sass /tmp/new-128.sass
"""
import re
import sys

from tools import sass_mix
from tools.offline import compile_recorded, record_launches

for d in (64, 128):
    for name, kernel, args, kwargs in record_launches((1, 2, 1024, d), quant="token"):
        if name == "backward_preprocess":
            sass = sass_mix.disassemble(compile_recorded(kernel, args, kwargs).asm["cubin"])
            with open(f"{sys.argv[1]}-{d}.sass", "w") as out:
                out.write(re.sub(r"/\*[0-9a-f]*\*/", "", sass))
            break
