"""Supervised fine-tuning (`tracerl sft`): conversations or recorded traces, trained with the
RL trainer's machinery (`tracerl.sft.run`)."""
