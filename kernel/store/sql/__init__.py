"""The SQL stores: schema and migrations, the statements and bodies SQLite and PostgreSQL share, each dialect, whole-run archives."""
