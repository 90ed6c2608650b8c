"""The flows over the store: the controller's check, submission, approvals, follow-ups."""
