#!/usr/bin/env bash
# Round 23, call 5 (an H200, needs_h200: the engine target is an H200's; carry .device; END (150) s
# of the call, for the budget's last minutes). The final code's graphed decode step at batch 256
# (served: the heads-first decode grid, round 22), twice if time is left, for the figure beside
# round 7's 7.90 ms (H200) and the target's 7.5.
set -uo pipefail
source perf/device_call.sh r23c5
END=${END:-150}
call_engine_step heads a $END
if [ "$(call_left $END)" -gt 60 ]; then call_engine_step heads b $END; fi
call_mark "done"
