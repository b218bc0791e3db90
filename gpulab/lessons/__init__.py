"""What only one lesson notebook needs: its workloads, claims, tables and figures (one module per lesson)."""
