# The whole GPU suite on the lent GPU, in two processes (correctness only, nothing timed beside it), then trainer pairs.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_triton_gpu.py tests/test_host_profile.py 2>/dev/null \
  | grep "::" > /tmp/ids; wc -l < /tmp/ids
awk 'NR%2==1' /tmp/ids > /tmp/h1; awk 'NR%2==0' /tmp/ids > /tmp/h2
mapfile -t A < /tmp/h1; mapfile -t B < /tmp/h2
(timeout 430 python3 -m pytest -q -p no:cacheprovider "${A[@]}" > $OUT/gpu-tests-1.txt 2>&1; echo "half 1 rc $?" >> $OUT/gpu-tests-1.txt) &
(timeout 430 python3 -m pytest -q -p no:cacheprovider "${B[@]}" > $OUT/gpu-tests-2.txt 2>&1; echo "half 2 rc $?" >> $OUT/gpu-tests-2.txt) &
wait
tail -4 $OUT/gpu-tests-1.txt $OUT/gpu-tests-2.txt
grep -h "FAILED\|ERROR" $OUT/gpu-tests-*.txt | head -20
