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

/** x32 system calls are x86-64 numbers with this bit set (same AUDIT_ARCH). */
const X32_SYSCALL_BIT = 0x40000000;

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
/** offsetof(struct seccomp_data, nr) and (…, arch). */
const DATA_NR = 0;
const DATA_ARCH = 4;

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
  if (arch === "x64") {
    deny.push(insns.length);
    insns.push({ code: BPF_JMP_JGE_K, jt: 0, jf: 0, k: X32_SYSCALL_BIT });
  }
  for (const nr of numbers) {
    deny.push(insns.length);
    insns.push({ code: BPF_JMP_JEQ_K, jt: 0, jf: 0, k: nr });
  }
  insns.push({ code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ALLOW });
  const refusal = insns.length;
  insns.push({ code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ERRNO | ENOSYS });
  for (const at of deny) {
    const jump = refusal - at - 1;
    if (jump > 255) throw new Error(`seccomp program too long: a jump of ${jump}`);
    insns[at]!.jt = jump;
  }
  const out = Buffer.alloc(insns.length * 8);
  insns.forEach((insn, i) => {
    out.writeUInt16LE(insn.code, i * 8);
    out.writeUInt8(insn.jt, i * 8 + 2);
    out.writeUInt8(insn.jf, i * 8 + 3);
    out.writeUInt32LE(insn.k >>> 0, i * 8 + 4);
  });
  return out;
}
