"""Job functions for tests of korch.profile.workers, in a module that takes longer to import than
those tests' time limit (as torch and ONNX Runtime do beside a busy neighbour)."""

import time

IMPORT_S = 3.0
time.sleep(IMPORT_S)


def echo(job: dict) -> dict:
    time.sleep(job.get("nap", 0.0))
    return {"status": "ok", **job}
