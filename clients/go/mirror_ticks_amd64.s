//go:build linux

#include "textflag.h"

// func cpuTicks() uint64
TEXT ·cpuTicks(SB), NOSPLIT, $0-8
	RDTSC
	SHLQ $32, DX
	ORQ  DX, AX
	MOVQ AX, ret+0(FP)
	RET
