"""The `score_mod` / `mask_mod` compiler: how `SoftmaxAttention`'s mods become a CPU path.

The stages, each in its own module, in the order a call meets them:
- `tracing`: the mods traced into one torch.fx graph over symbolic arguments, on every
  call (a plain value a mod reads may change between calls), and how an operation of the
  graph is read;
- `structure`: what the graph proves the score_mod is (relative, additive or general,
  with the reason) and whether the mask_mod is a function of kv_idx − q_idx;
- `grid`: the calling convention (FlexAttention's index grid), the pairs the mask allows,
  and the spans of keys each block of queries sees;
- `program` (its `Builder` and `ModProgram`), `operations` (one lowering per operation, a
  table keyed by operation, as torch's own lowerings are) and `lowering` (the graph
  walked into a program, or the reason it cannot be); `program.h` is the program's
  native interpreter, compiled into `playground.kernels.native`; `reference` evaluates a
  program with torch, the interpreter's oracle;
- `kernel`: a program run by the native blocked kernels, forward and backward;
- `dispatch`: the one decision of which CPU path a call takes (`CpuPath`, with its
  reason);
- `scheduler`: the blocks of queries that run the chosen path.

Above `playground.kernels` (which know nothing of mods) and beneath
`playground.softmax_attention`, which calls it. Nothing here is public API: a plugin
writes mods, and imports `playground.SoftmaxAttention`.
"""
