"""A run: a spec (`spec`, read by `spec_loading` and `spec_tasks`) planned into cells
(`cells`), each measured where it runs (`measurer`, over `measure`, `fidelity`,
`accuracy` and the seeds of `seeds`) by an executor (`executors`, handed a `context`),
and appended as a row (`rows`) to the run directory (`store`, with `environment`) by the
runner (`runner`); `resume` turns a run directory back into a run."""
