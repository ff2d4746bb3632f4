"""``python -m aiolock._bench contend SECONDS COUNTER OUTPUT URL...``: one contention worker."""

import sys

from .contention import worker_main

if __name__ == "__main__" and sys.argv[1:2] == ["contend"]:
    sys.exit(worker_main(sys.argv[2:]))
