"""Starting, supervising and stopping the server: CLI, launcher, supervisor, ports, processes."""
