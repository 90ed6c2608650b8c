"""The PostgreSQL engine (optional extra ``pollwarden[postgres]``): psycopg 3 and its pool."""
