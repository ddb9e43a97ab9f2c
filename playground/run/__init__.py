"""A run: a spec (`spec`) planned into cells, each measured (`measure`, `fidelity`,
`accuracy`) by an executor (`executors`) and appended as a row to the run directory
(`store`) by the runner (`runner`)."""
