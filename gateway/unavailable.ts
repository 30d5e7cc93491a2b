/** Retry-After for 503 answers: 1 to 3 seconds, varying across clients so they do not return together. */
export function retryAfterSeconds(random: () => number = Math.random): number {
  return 1 + Math.floor(random() * 3);
}
