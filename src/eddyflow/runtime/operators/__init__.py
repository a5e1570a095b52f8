"""The operators a task chains: stateless and keyed ones, windows."""
