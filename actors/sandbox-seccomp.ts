/**
 * The system calls a sandboxed command is refused, as the classic BPF program bwrap loads
 * with `--seccomp` (it sets no_new_privs and installs it right before it execs the command).
 *
 * Two lists. In every mode, calls that open kernel attack surface no tool needs: key
 * rings, BPF programs, userfaultfd, perf events, io_uring, kexec, secret memory and, on
 * x86-64, `uselib` and `modify_ldt` (Docker's default profile refuses these too; most of
 * what else it refuses needs capabilities a sandboxed command does not have). Without a memory
 * cgroup also the ways to hold memory no rlimit counts: System V shared memory, message
 * queues and semaphore sets (they live in the command's IPC namespace until the command
 * ends; measured: 1.5 GiB of segments at a 512 MiB limit), and memfd files (each as large
 * as the file size limit, as many as the command may open). With a memory cgroup those are
 * charged to the command and stay allowed.
 *
 * Also every call numbered past the last one Linux had when this list was written
 * (`file_setattr`, 469, in 6.17; none came in 6.18): a kernel newer than that may bring
 * new surface, and a program meets such a call refused as it would on an older kernel.
 * And `personality` only for the values Docker's default profile allows (Linux, its
 * 32-bit `uname`, the query): the other flags turn off address-space randomisation, map
 * page zero or make reads imply execution; refused with EPERM, as an argument the
 * caller may not set.
 *
 * And `fallocate`, which reserves a file's blocks without writing them: one command took
 * 4 GiB of the node's disk in 10 ms that way (found by a probe), before any measure of the
 * workspace could see it, so `disk_mb` and `RUNS_DISK_RESERVE_MB` came too late. It fails
 * with EOPNOTSUPP, as on a filesystem without it, and so do the ioctls that reserve or zero
 * blocks the same way (`FS_IOC_RESVSP`, `FS_IOC_RESVSP64`, `FS_IOC_ZERO_RANGE`): glibc's
 * `posix_fallocate` then writes the blocks (musl's, Go's and Rust's report the error), at
 * the speed the kernel lets a process write, which the measures that stop a command follow.
 *
 * A refused call fails with ENOSYS, as on a kernel built without it, so programs take
 * the fallback they have for such kernels (libuv without io_uring, a runtime without
 * memfd). Calls of another ABI than the node's (32-bit x86 through `int 0x80`, x32, 32-bit
 * ARM) are refused whole: their numbers differ, and 32-bit x86 reaches System V IPC
 * through one multiplexed call.
 */

/** The architectures a filter is built for; elsewhere commands run without one (warned at start). */
export type SeccompArch = "x64" | "arm64";

/** AUDIT_ARCH_* of each (linux/audit.h): the machine, 64-bit, little-endian. */
const AUDIT_ARCH: Record<SeccompArch, number> = { x64: 0xc000003e, arm64: 0xc00000b7 };

/**
 * Calls numbered from here on are refused: one past Linux 6.17's last (`file_setattr`,
 * 469 on both architectures, which share the numbers of every call since 5.1).
 */
export const FIRST_UNKNOWN_SYSCALL = 470;

/** `fallocate`'s number: x86-64, arm64. */
const FALLOCATE = { x64: 285, arm64: 47 } as const satisfies Record<SeccompArch, number>;

/** `ioctl`'s number: x86-64, arm64. */
const IOCTL = { x64: 16, arm64: 29 } as const satisfies Record<SeccompArch, number>;

/**
 * The ioctl requests the kernel serves as a `fallocate`, all `_IOW('X', n, struct
 * space_resv)`: FS_IOC_RESVSP (40), FS_IOC_RESVSP64 (42) and FS_IOC_ZERO_RANGE (57)
 * (fs/ioctl.c), and XFS's ALLOCSP (10), FREESP (11), ALLOCSP64 (36) and FREESP64 (37),
 * which map unwritten blocks the same way on kernels before 5.17 (CVE-2021-4155's fix).
 * Those that only free blocks (UNRESVSP) stay allowed.
 */
export const PREALLOCATING_IOCTLS: readonly number[] = [0x40305828, 0x4030582a, 0x40305839, 0x4030580a, 0x4030580b, 0x40305824, 0x40305825];

/** `personality`'s number: x86-64, arm64. */
const PERSONALITY = { x64: 135, arm64: 92 } as const satisfies Record<SeccompArch, number>;

/**
 * The `personality` values a command may set (Docker's default profile): PER_LINUX,
 * PER_LINUX32, UNAME26 alone and with PER_LINUX32, and 0xffffffff, which only asks. The
 * argument is an `unsigned int`: the kernel reads the low 32 bits only.
 */
export const PERSONALITIES_ALLOWED: readonly number[] = [0x0, 0x8, 0x20000, 0x20008, 0xffffffff];

/** System call numbers (asm/unistd_64.h for x86-64, asm-generic/unistd.h for arm64); none where the architecture has no such call. */
const SYSCALL_NUMBERS = {
  add_key: { x64: 248, arm64: 217 },
  request_key: { x64: 249, arm64: 218 },
  keyctl: { x64: 250, arm64: 219 },
  bpf: { x64: 321, arm64: 280 },
  userfaultfd: { x64: 323, arm64: 282 },
  perf_event_open: { x64: 298, arm64: 241 },
  io_uring_setup: { x64: 425, arm64: 425 },
  io_uring_enter: { x64: 426, arm64: 426 },
  io_uring_register: { x64: 427, arm64: 427 },
  kexec_load: { x64: 246, arm64: 104 },
  kexec_file_load: { x64: 320, arm64: 294 },
  shmget: { x64: 29, arm64: 194 },
  msgget: { x64: 68, arm64: 186 },
  semget: { x64: 64, arm64: 190 },
  memfd_secret: { x64: 447, arm64: 447 },
  uselib: { x64: 134 },
  modify_ldt: { x64: 154 },
  memfd_create: { x64: 319, arm64: 279 },
} as const satisfies Record<string, Partial<Record<SeccompArch, number>>>;

export type SyscallName = keyof typeof SYSCALL_NUMBERS;

/** Refused in every mode: kernel attack surface. */
export const ALWAYS_REFUSED: readonly SyscallName[] = [
  "add_key",
  "request_key",
  "keyctl",
  "bpf",
  "userfaultfd",
  "perf_event_open",
  "io_uring_setup",
  "io_uring_enter",
  "io_uring_register",
  "kexec_load",
  "kexec_file_load",
  "memfd_secret",
  "uselib",
  "modify_ldt",
];

/** Refused where no memory cgroup counts what they hold. */
export const REFUSED_WITHOUT_MEMORY_CGROUP: readonly SyscallName[] = ["shmget", "msgget", "semget", "memfd_create"];

/** The system calls a command is refused. */
export function refusedSyscalls(memoryCgroup: boolean): SyscallName[] {
  return memoryCgroup ? [...ALWAYS_REFUSED] : [...ALWAYS_REFUSED, ...REFUSED_WITHOUT_MEMORY_CGROUP];
}

/** The architecture of this node, when a filter can be built for it. */
export function seccompArchOf(arch: string = process.arch): SeccompArch | undefined {
  return arch === "x64" || arch === "arm64" ? arch : undefined;
}

// Classic BPF (linux/filter.h, linux/seccomp.h).
const BPF_LD_W_ABS = 0x20;
const BPF_JMP_JEQ_K = 0x15;
const BPF_JMP_JGE_K = 0x35;
const BPF_RET_K = 0x06;
const SECCOMP_RET_ALLOW = 0x7fff0000;
const SECCOMP_RET_ERRNO = 0x00050000;
export const ENOSYS = 38;
export const EPERM = 1;
export const EOPNOTSUPP = 95;
/** offsetof(struct seccomp_data, nr), (…, arch) and the low word of args[0] (little-endian). */
const DATA_NR = 0;
const DATA_ARCH = 4;
const DATA_ARG0_LOW = 16;
const DATA_ARG1_LOW = 24;

/** The number of `name` on `arch`, if it has that call. */
function numberOf(name: SyscallName, arch: SeccompArch): number | undefined {
  const numbers: Partial<Record<SeccompArch, number>> = SYSCALL_NUMBERS[name];
  return numbers[arch];
}

interface Insn {
  code: number;
  jt: number;
  jf: number;
  k: number;
}

/**
 * The filter as bwrap's `--seccomp` reads it: `struct sock_filter` entries (u16 code, u8
 * jt, u8 jf, u32 k), in the machine's byte order (little-endian on both architectures).
 */
export function seccompProgram(arch: SeccompArch, refused: readonly SyscallName[]): Buffer {
  const numbers = [...new Set(refused.flatMap((name) => numberOf(name, arch) ?? []))].sort((a, b) => a - b);
  const insns: Insn[] = [];
  const deny: number[] = []; // indexes whose jt jumps to the refusal
  insns.push({ code: BPF_LD_W_ABS, jt: 0, jf: 0, k: DATA_ARCH });
  // Another ABI: skip to the refusal right after (jf 0 falls through to it).
  insns.push({ code: BPF_JMP_JEQ_K, jt: 1, jf: 0, k: AUDIT_ARCH[arch] });
  insns.push({ code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ERRNO | ENOSYS });
  insns.push({ code: BPF_LD_W_ABS, jt: 0, jf: 0, k: DATA_NR });
  // x32's calls are x86-64 numbers with bit 30 set (same AUDIT_ARCH): past the last known call too.
  deny.push(insns.length);
  insns.push({ code: BPF_JMP_JGE_K, jt: 0, jf: 0, k: FIRST_UNKNOWN_SYSCALL });
  for (const nr of numbers) {
    deny.push(insns.length);
    insns.push({ code: BPF_JMP_JEQ_K, jt: 0, jf: 0, k: nr });
  }
  // fallocate: "not supported here", so callers write the blocks instead.
  insns.push({ code: BPF_JMP_JEQ_K, jt: 0, jf: 1, k: FALLOCATE[arch] });
  insns.push({ code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ERRNO | EOPNOTSUPP });
  // ioctl: the requests that preallocate the same way; every other request is allowed (the
  // block ends in a return: the accumulator then holds the request, not the call's number).
  const ioctl = insns.length;
  insns.push({ code: BPF_JMP_JEQ_K, jt: 0, jf: 0, k: IOCTL[arch] });
  insns.push({ code: BPF_LD_W_ABS, jt: 0, jf: 0, k: DATA_ARG1_LOW });
  const unsupported = insns.length + PREALLOCATING_IOCTLS.length + 1; // past the comparisons and the allow
  for (const request of PREALLOCATING_IOCTLS) insns.push({ code: BPF_JMP_JEQ_K, jt: jumpTo(unsupported, insns.length), jf: 0, k: request });
  insns.push({ code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ALLOW });
  insns.push({ code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ERRNO | EOPNOTSUPP });
  insns[ioctl]!.jf = jumpTo(insns.length, ioctl);
  const personality = insns.length;
  insns.push({ code: BPF_JMP_JEQ_K, jt: 0, jf: 0, k: PERSONALITY[arch] });
  insns.push({ code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ALLOW });
  const refusal = insns.length;
  insns.push({ code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ERRNO | ENOSYS });
  for (const at of deny) insns[at]!.jt = jumpTo(refusal, at);
  // personality: allowed values jump to the allow after the list, others fall to EPERM.
  insns[personality]!.jt = jumpTo(insns.length, personality);
  insns.push({ code: BPF_LD_W_ABS, jt: 0, jf: 0, k: DATA_ARG0_LOW });
  const allow = insns.length + PERSONALITIES_ALLOWED.length + 1; // past the comparisons and the EPERM
  for (const value of PERSONALITIES_ALLOWED) insns.push({ code: BPF_JMP_JEQ_K, jt: jumpTo(allow, insns.length), jf: 0, k: value });
  insns.push({ code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ERRNO | EPERM });
  insns.push({ code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ALLOW });
  const out = Buffer.alloc(insns.length * 8);
  insns.forEach((insn, i) => {
    out.writeUInt16LE(insn.code, i * 8);
    out.writeUInt8(insn.jt, i * 8 + 2);
    out.writeUInt8(insn.jf, i * 8 + 3);
    out.writeUInt32LE(insn.k >>> 0, i * 8 + 4);
  });
  return out;
}

/** A forward jump's offset from the instruction at `from` to the one at `to` (classic BPF jumps forward, at most 255). */
function jumpTo(to: number, from: number): number {
  const jump = to - from - 1;
  if (jump < 0 || jump > 255) throw new Error(`seccomp program: no jump of ${jump}`);
  return jump;
}
