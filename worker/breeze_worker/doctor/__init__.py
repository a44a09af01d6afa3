"""`breeze-worker doctor`: what this host can do with Breeze TTS 2, and what to do next.

- `facts`: the device (name, compute capability, memory, clocks, driver, library versions) and whether
  something else is using it;
- `probes`: the measurements on a CUDA GPU (copy bandwidth, the byte floor, a short fast-path probe, a
  precision agreement check against FP32, memory per stream, start-up split);
- `figures`: the inputs of the verdict: this project's recorded H200 figures and datasheet figures of GPU
  classes (`Figures`, `GpuClass`);
- `verdict`: pure functions from figures to the verdict lines (projected RTF, streams, stop condition, what
  to do next, cost per audio hour);
- `footprint`: what a model occupies and streams, from its configuration alone;
- `report`: the JSON document (schema `breeze-doctor/1`) and the text report;
- `sandbox`: the compilers' on-disk caches in a temporary directory for the run.

The doctor never changes the host or the model: it sets no clocks or power limits, writes nothing but its
`--json` file, and keeps the compilers' caches in a temporary directory it removes.
"""
