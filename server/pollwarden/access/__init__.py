"""Who may do what: principals, tokens, ownership, operator keys and the approval policy."""
