"""Does the planner's simulator match real runs; what autoscaling policies cost."""
