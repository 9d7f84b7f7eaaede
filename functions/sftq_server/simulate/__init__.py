"""`sftq simulate`: replay a trace of jobs through the real admission on a virtual clock."""
