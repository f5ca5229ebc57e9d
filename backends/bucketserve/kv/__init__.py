"""KV transport: pool export/import (shm / CUDA IPC), prefill->decode hand-off table, stats."""
