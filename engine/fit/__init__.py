"""Will the model fit? The memory a profile needs, estimated from the GGUF headers before a load,
set against what the machine has (docs/fit.md).

`model_facts` reads what the estimate needs from the headers of every shard, `estimate` turns it
and the profile into terms (weights by placement, KV cache, recurrent state, compute buffers,
checkpoints, the PLE table), `machine` reads the memory the machine has, `report` decides and
draws the table, and `residency` says how much of a file range is in the page cache.
"""
