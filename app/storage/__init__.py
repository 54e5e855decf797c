"""SQLite storage: the only package that holds a connection or writes SQL."""
