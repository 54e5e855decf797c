"""The HTTP process's side of the child processes, and the follower."""
