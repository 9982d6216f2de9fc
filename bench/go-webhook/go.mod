module ix-gpu.io/bench/go-webhook

go 1.26
