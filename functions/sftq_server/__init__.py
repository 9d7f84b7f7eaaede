"""Server side of finetune-queue: database access, HTTP functions, scheduler, simulator."""
